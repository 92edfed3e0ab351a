"""The baselines: Hugging Face transformers' LlamaForCausalLM with the very same weights (taken
from our loader, so both read the same dequantised GGUF): generate() on static padded batches,
and transformers' own continuous batching (`ContinuousBatchingManager`, transformers >= 5),
greedy or sampled (benchmarks/sampling.py). The bench runs them in a child process
(load_hf, benchmarks/baseline_process.py), as every baseline."""

from __future__ import annotations

import contextlib

import torch

from benchmarks.sampling import GREEDY, Sampling
from services.worker.model.loader import LoadedModel


def hf_model(loaded: LoadedModel, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    c = loaded.config
    config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        torch_dtype=dtype,
    )
    with _no_init_weights():  # every weight is overwritten below: skip the random init
        model = LlamaForCausalLM(config).to(dtype).eval()
    loaded_keys = model.load_state_dict(hf_state_dict(loaded), strict=False)
    # lm_head is tied to the embedding below; any other gap would be uninitialised memory.
    if set(loaded_keys.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"transformers model left without weights: {loaded_keys.missing_keys}")
    if c.tie_word_embeddings:
        model.tie_weights()
    return model


def load_hf(dtype: str = "float32", threads: int = 0):
    """transformers' model on the packaged GGUF's weights, loaded here: a child process's
    factory (the model never crosses the process boundary). threads: torch's (0: default)."""
    from services.worker.model.loader import default_path, load_model

    if threads:
        torch.set_num_threads(threads)
    torch_dtype = getattr(torch, dtype)
    loaded = load_model(default_path(), dtype=torch_dtype, device=torch.device("cpu"))
    return hf_model(loaded, torch_dtype)


def _no_init_weights():
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights  # transformers 4
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def hf_state_dict(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """Our fused qkv / gate_up weights split back into Hugging Face's names."""
    c, ours = loaded.config, loaded.model
    state = {
        "model.embed_tokens.weight": ours.embed_tokens.data,
        "model.norm.weight": ours.norm.weight.data,
    }
    if ours.lm_head is not None:
        state["lm_head.weight"] = ours.lm_head.data
    for i, layer in enumerate(ours.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.self_attn.qkv_proj.data.split([c.q_size, c.kv_size, c.kv_size])
        gate, up = layer.mlp.gate_up_proj.data.split([c.intermediate_size] * 2)
        state.update(
            {
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": layer.self_attn.o_proj.data,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.mlp.down_proj.data,
                p + "input_layernorm.weight": layer.input_layernorm.weight.data,
                p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight.data,
            }
        )
    return state


def _sampling_kwargs(sampling: Sampling) -> dict:
    if sampling.greedy:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": 0,
    }


@torch.inference_mode()
def hf_generate(
    model,
    prompts: list[list[int]],
    output_lens: list[int],
    batch_size: int,
    pad_id: int = 0,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> list[list[int]]:
    """EOS ignored, static batches of `batch_size` (left-padded). Each batch runs to its
    longest output; only the tokens each request asked for are kept (and counted). Sampled:
    one HF batch draws from one torch generator, so per-request seeds are impossible; each
    batch is seeded with `seed` + its index instead."""
    results: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(prompts), batch_size):
        torch.manual_seed(seed + start)
        idx = list(range(start, min(start + batch_size, len(prompts))))
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        new = max(output_lens[i] for i in idx)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=pad_id,
            **_sampling_kwargs(sampling),
            eos_token_id=None,
        )
        for row, i in enumerate(idx):
            results[i] = out[row, width : width + output_lens[i]].tolist()
    return results


def continuous_batching_available(model) -> bool:
    """Whether this transformers has the continuous-batching path (`init_continuous_batching`,
    `generate_batch`; in transformers 5.x)."""
    return hasattr(model, "init_continuous_batching") and hasattr(
        model, "continuous_batching_context_manager"
    )


@torch.inference_mode()
def hf_continuous(
    model,
    prompts: list[list[int]],
    output_lens: list[int],
    max_batch_tokens: int | None = None,
    max_requests: int | None = None,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> list[list[int]]:
    """EOS ignored, through transformers' ContinuousBatchingManager: every request is queued at
    once, each with its own output length. Sampled: its batches draw from torch's one global
    generator, seeded once with `seed` (no per-request seeds). Its warm-up (CUDA-graph capture
    on a GPU) is skipped here: the caller times a warm-up run of its own first."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    torch.manual_seed(seed)
    config = GenerationConfig(
        max_new_tokens=max(output_lens),
        eos_token_id=None,
        pad_token_id=0,
        **_sampling_kwargs(sampling),
    )
    cb_config = ContinuousBatchingConfig(
        max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_requests
    )
    results = {}
    with model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cb_config, block=True, warmup=False
    ) as manager:
        for i, (prompt, out_len) in enumerate(zip(prompts, output_lens, strict=True)):
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=out_len, eos_token_id=-1)
        while len(results) < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                if result.error:
                    raise RuntimeError(f"transformers continuous batching: {result.error}")
                results[result.request_id] = result.generated_tokens
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous-batching thread stopped early")
    return [results[f"r{i}"] for i in range(len(prompts))]
