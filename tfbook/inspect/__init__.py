"""Looking inside a model: hooks and caches (hooks), the logit lens (lens), direct logit
attribution (attribution), attention-pattern scores (scores) and patching (patching)."""

from tfbook.inspect.hooks import (
    ActivationCache,
    add,
    hook_names,
    hook_points,
    hooks,
    patch,
    replace,
    run_with_cache,
    zero,
)

__all__ = ["ActivationCache", "add", "hook_names", "hook_points", "hooks", "patch", "replace",
           "run_with_cache", "zero"]
