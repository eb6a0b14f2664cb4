"""What vLLM refuses in a PEFT adapter at run time (the engine's pre-check and the sim engine share these rules)."""

from __future__ import annotations

from typing import Any

# PEFT initialisations that rewrite the base weights as they make the adapter: such an adapter is only right
# on its own modified base, which vLLM does not have (PEFT's docs: convert it to a plain LoRA first).
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq")


def lora_config_problem(config: dict[str, Any], max_lora_rank: int) -> str | None:
    """Why vLLM would refuse an adapter with this adapter_config.json (None: it loads).

    vLLM serves plain LoRA only: no modules_to_save, no DoRA, no LoRA bias, every rank (``r`` and each
    ``rank_pattern`` value) at most --max-lora-rank, and no initialisation that changed the base weights.
    """
    saved = config.get("modules_to_save") or []
    if saved:
        names = ", ".join(map(str, saved)) if isinstance(saved, list) else str(saved)
        return f"vLLM cannot hot-load an adapter with modules_to_save ({names})"
    if config.get("use_dora") is True:
        return "vLLM does not serve DoRA adapters (use_dora: true)"
    bias = config.get("bias", "none")
    if bias not in (None, "none"):
        return f"vLLM does not serve LoRA adapters with bias (bias: {bias})"
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(BASE_CHANGING_INITS):
        return (
            f"the adapter was initialised with {init}, which changed its base weights; vLLM serves it on the "
            "unchanged base (convert it to a plain LoRA with PEFT first)"
        )
    if config.get("loftq_config"):
        return "the adapter was initialised with LoftQ (loftq_config), which changed its base weights"
    ranks = [("r", config.get("r"))]
    pattern = config.get("rank_pattern")
    if isinstance(pattern, dict):
        ranks += [(f"rank_pattern[{key}]", value) for key, value in pattern.items()]
    for where, rank in ranks:
        if isinstance(rank, int) and not isinstance(rank, bool) and rank > max_lora_rank:
            return f"LoRA rank {rank} ({where}) is greater than max_lora_rank {max_lora_rank}"
    return None
