// Where require.js finds the widget front ends: next to this file, on the same site.
// Without this the widget manager would fetch them from a CDN (and its icon fonts from a
// path that does not exist), and the book must work offline.
(function () {
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  require.config({
    paths: {
      anywidget: here + "anywidget/index",
      "@jupyter-widgets/html-manager/dist": here + "html-manager",
      // webpack places the icon fonts next to the module that asked for them: any other
      // @jupyter-widgets/* module id must also resolve to the folder that holds them
      "@jupyter-widgets": here + "html-manager",
    },
  });
})();
