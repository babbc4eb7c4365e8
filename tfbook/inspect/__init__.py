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
from tfbook.inspect.patching import (
    PatchingResult,
    activation_patching,
    attribution_patching,
    disagreements,
    logit_diff,
    patch_once,
    restored_fraction,
)

__all__ = ["ActivationCache", "add", "hook_names", "hook_points", "hooks", "patch", "replace",
           "run_with_cache", "zero"]
__all__ += ["PatchingResult", "activation_patching", "attribution_patching", "disagreements",
            "logit_diff", "patch_once", "restored_fraction"]
