"""The CUDA path: the bundled model on a GPU, in fp32 and in bf16 (the app's default there), against references
with no kvviz code in them.

Skipped where there is no GPU (CI); run where one is lent: ``pytest tests/model/test_cuda.py``. The rest of the suite
pins itself to CPU fp32 (``tests/conftest.py``); here the model is loaded on ``cuda`` explicitly. References: transformers'
own eager attention in the same dtype on the same device (a full forward without cache), the same model in fp32 on
CPU, and a cache with evicted slots physically removed. In fp32 the tolerances are nearly the CPU's: a wrong slot,
position or mask shows at once. bf16 keeps 8 bits of mantissa, so two correct bf16 programs that add in a different
order differ by rounding; its tolerances say how much, and each assertion prints what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvviz.edit.edit import Edit
from kvviz.model import LoadedModel, load_model, resolve_checkpoint
from kvviz.policies import POLICIES
from kvviz.session import Session
from kvviz.whatif import what_if
from tests.support.references import committed_eviction_gaps, removed_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@dataclass(frozen=True)
class Tol:
    logit: float  # |Δ logit| (logits are O(10))
    weight: float  # |Δ α| of attention weights
    prob: float  # |Δ p| of next-token probabilities


# fp32 on the GPU: only the kernels' order of addition differs from the references (CPU: 1e-4 / 1e-6 / 1e-5).
# bf16: measured on an H200, 2026-11-29: 0.625 / 0.030 / 0.029 against the same model's eager bf16 forward.
TOLERANCES = {torch.float32: Tol(logit=2e-3, weight=1e-4, prob=1e-4), torch.bfloat16: Tol(logit=1.0, weight=0.05, prob=0.05)}
KL_TOL = 0.02  # KL(fp32 CPU ‖ bf16 GPU) of the next-token distribution


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def gpu(request) -> LoadedModel:
    return load_model(device="cuda", dtype=request.param)


@pytest.fixture(scope="module")
def tol(gpu) -> Tol:
    return TOLERANCES[gpu.dtype]


@pytest.fixture(scope="module")
def eager_gpu(gpu):
    folder, _ = resolve_checkpoint(None)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=gpu.dtype, attn_implementation="eager")
    return model.to(gpu.device).eval().requires_grad_(False)


def conversation(lm: LoadedModel) -> Session:
    session = Session(lm)
    session.add_user_turn("Remember: a = 3 and b = 5. Answer in one word. What is a + b?")
    session.generate(8)
    session.add_user_turn("And what is b - a?")
    return session


@pytest.fixture(scope="module")
def chat(gpu) -> Session:
    return conversation(gpu)


def forward(model, ids: list[int], device, **kwargs):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=device), use_cache=False, **kwargs)


def test_bundled_model_runs_in_bf16_on_cuda_close_to_fp32():
    lm = load_model(device="cuda")
    assert lm.device.type == "cuda" and lm.dtype == torch.bfloat16 and lm.device_label == "cuda · bfloat16"
    assert {p.device.type for p in lm.model.parameters()} == {"cuda"}
    session = conversation(lm)
    exact = forward(load_model(device="cpu").model, session.transcript.ids, "cpu").logits[0, -1].double()
    kl = torch.nn.functional.kl_div(session.logits.double().cpu().log_softmax(-1), exact.log_softmax(-1),
                                    log_target=True, reduction="sum").item()
    assert kl <= KL_TOL, f"KL(fp32 CPU ‖ bf16 GPU) = {kl:.5f}"


def test_turns_match_a_full_eager_forward(gpu, tol, eager_gpu, chat):
    reference = forward(eager_gpu, chat.transcript.ids, gpu.device).logits[0, -1].float()
    ours = chat.logits.float().to(gpu.device)
    gap = (reference - ours).abs().max().item()
    assert gap <= tol.logit, f"max |Δ logit| vs eager = {gap:.5f}"
    if gpu.dtype == torch.float32:  # bf16 rounding may swap near ties
        assert int(reference.argmax()) == int(ours.argmax())


def test_recorded_weights_match_eager_output_attentions(gpu, tol, eager_gpu, chat):
    attentions = forward(eager_gpu, chat.transcript.ids, gpu.device, output_attentions=True).attentions
    n = len(chat)
    for layer in (0, 7, 15, 29):
        ours = chat.weights(layer).float()  # (H, n, n) from recorded queries and cached keys
        assert ours.shape == (gpu.heads, n, n) and ours.device.type == "cuda"
        gap = (ours - attentions[layer][0].float()).abs().max().item()
        assert gap <= tol.weight, f"layer {layer}: max |Δ α| = {gap:.6f}"
        assert torch.allclose(ours.sum(-1), torch.ones(gpu.heads, n, device=gpu.device), atol=tol.weight)


@pytest.mark.parametrize("evicted", [[5, 6, 7], list(range(20, 32))])
def test_evicting_equals_removing_on_cuda(gpu, tol, chat, evicted):
    at = len(chat) - 1
    reference = removed_step(chat, at, evicted).double().softmax(-1).cpu()
    result = what_if(chat, Edit.evict(evicted), at=at, topk=20, continuation=4)
    gaps = [abs(c.prob - float(reference[c.id])) for c in result.next_token.edited]
    assert max(gaps) <= tol.prob, f"max |Δ p| = {max(gaps):.6f}"
    if gpu.dtype == torch.float32:
        assert result.next_token.edited[0].id == int(reference.argmax())
    assert result.next_token.kl > 0 and all(0 < rho < 1 for rho in result.heads["rho"].tolist()[0])
    assert result.continuation is not None and 1 <= len(result.continuation.edited_ids) <= 4


def test_quantized_what_if_on_cuda(chat):
    before = len(chat) - 1
    results = {bits: what_if(chat, Edit.quantize(range(before), bits)) for bits in (8, 4, 2)}
    kl = [results[b].next_token.kl for b in (8, 4, 2)]
    assert kl[0] < kl[1] < kl[2], f"KL by bits 8/4/2 = {kl}"
    sizes = [results[b].memory.edited_bytes for b in (8, 4, 2)]
    assert results[8].memory.full_bytes > sizes[0] > sizes[1] > sizes[2]
    split = results[4].detail  # docs/math.md §4: weight term + content term = isolated change
    total = [w + c for w, c in zip(split.weight_term, split.content_term)]
    assert total == pytest.approx(split.delta_isolated, rel=1e-3, abs=1e-4)


def test_every_policy_runs_on_cuda(chat):
    at = len(chat) - 1
    for name, policy in POLICIES.items():
        edit = policy().edit(chat, 16, at)
        mask = edit.evicted_mask(at + 1, chat.lm.layers, chat.lm.kv_heads)
        counts = (~mask[:, :, :at]).sum(-1)
        if name in ("pyramid_kv", "ada_kv"):  # 16 on average, shared unevenly (tests/model/test_whatif.py)
            assert abs(float(counts.float().mean()) - 16) <= 0.5, name
        elif name != "chunk_kv":  # whole chunks (tests/model/test_whatif.py)
            assert bool((counts == 16).all()), name
        assert what_if(chat, edit, at=at).next_token.kl > 0, name


def test_committed_eviction_decodes_like_a_removed_cache(gpu, tol):
    _, gaps = committed_eviction_gaps(gpu, 4)
    assert max(gaps) <= tol.logit, f"max |Δ logit| per step = {gaps}"


def test_device_map_auto_places_the_model_and_computes_the_same(gpu, tol, chat):
    spread = load_model(device="cuda", device_map="auto", dtype=gpu.dtype)
    assert spread.device.type == "cuda" and spread.dtype == gpu.dtype
    ids = chat.transcript.ids[:40]
    same = forward(spread.model, ids, spread.device).logits[0, -1].float().cpu()
    plain = forward(gpu.model, ids, gpu.device).logits[0, -1].float().cpu()
    assert (same - plain).abs().max().item() <= tol.logit
