"""Looking inside a model: hooks and caches (hooks), the logit lens (lens), direct logit
attribution (attribution), attention-pattern scores (scores) and patching (patching)."""

from tfbook.inspect.attribution import (
    Attribution,
    attribution_names,
    direct_logit_attribution,
    final_stream_parts,
    logit_direction,
)
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
from tfbook.inspect.lens import (
    entropy,
    kl_to_final,
    lens_names,
    logit_lens,
    residual_stack,
    scale_ratios,
    target_prob,
    target_rank,
    top_tokens,
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
from tfbook.inspect.scores import (
    KINDS,
    HeadsOfKind,
    best_head,
    detection_mask,
    head_scores,
    heads_of_kind,
    pattern_score,
    repeated_random_tokens,
    score_rounding,
    scores_from_cache,
    uniform_baseline,
)

__all__ = ["ActivationCache", "add", "hook_names", "hook_points", "hooks", "patch", "replace",
           "run_with_cache", "zero"]
__all__ += ["PatchingResult", "activation_patching", "attribution_patching", "disagreements",
            "logit_diff", "patch_once", "restored_fraction"]
__all__ += ["Attribution", "attribution_names", "direct_logit_attribution", "final_stream_parts",
            "logit_direction"]
__all__ += ["entropy", "kl_to_final", "lens_names", "logit_lens", "residual_stack",
            "scale_ratios", "target_prob", "target_rank", "top_tokens"]
__all__ += ["KINDS", "HeadsOfKind", "best_head", "detection_mask", "head_scores",
            "heads_of_kind", "pattern_score", "repeated_random_tokens", "score_rounding",
            "scores_from_cache", "uniform_baseline"]
