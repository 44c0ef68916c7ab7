"""kvpress' own code in kvviz: presses written here in kvpress' ``ScorerPress`` shape run through
``from_kvpress(PressClass)`` in a prefill-mode policy run, and keep exactly what the native kvviz policy keeps — one
that scores keys alone, and one that recomputes the window's queries from the recorded hidden states (with the module
and the position embeddings kvpress passes) and scores by their attention."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from kvviz.errors import KvvizError
from kvviz.policies import KeyNorm, Policy
from kvviz.policies.base import Candidates, Ratio
from kvviz.policies.by_name import policy_named
from kvviz.policies.kvpress import own_code
from kvviz.policies.kvpress.presses import from_kvpress, from_press
from kvviz.policies.user import load
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.session import Session
from tests.support.rounding import rescored_weight_rounding

PROMPT = "Ann keeps bees, Bob keeps goats and Cy keeps ducks. Who keeps goats? Answer with the name."
WINDOW = 8


@dataclass
class NormPress:  # kvpress' KnormPress, in its shape
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1)


@dataclass
class WindowPress:  # the last WINDOW queries' attention, recomputed from hidden states as kvpress' SnapKV does
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        bsz, q_len, _ = hidden_states.shape
        heads, dim = module.config.num_attention_heads, module.head_dim
        query = module.q_proj(hidden_states).view(bsz, q_len, heads, dim).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        query, _ = apply_rotary_pos_emb(query, query, cos, sin)
        query = query[:, :, -WINDOW:]
        groups = heads // keys.shape[1]
        weights = query @ repeat_kv(keys, groups).transpose(2, 3) / math.sqrt(dim)
        weights += torch.triu(torch.full_like(weights, float("-inf")), diagonal=q_len - WINDOW + 1)
        weights = weights.softmax(-1)  # (1, H, WINDOW, at)
        return weights.sum(2).view(bsz, keys.shape[1], groups, q_len).sum(2)


@dataclass(frozen=True)
class Window(Policy):  # the native counterpart: the same attention from the recorded queries
    name = "window"

    def score(self, candidates: Candidates) -> torch.Tensor:
        return candidates.attention(slice(candidates.at - WINDOW, candidates.at))


def kept(lm, policy) -> torch.Tensor:
    run = CompressedSession(lm, RunSettings(policy, Ratio(0.5), "prefill"))
    run.add_turn(PROMPT)
    return run.alive()


def test_a_press_that_scores_keys_keeps_what_key_norm_keeps(lm):
    press = from_kvpress(NormPress, compression_ratio=0.5)
    assert press.ratio.ratio == 0.5 and press.policy.settings() == {"press": "NormPress"}
    assert torch.equal(kept(lm, press.policy), kept(lm, KeyNorm()))


def test_a_press_that_reads_hidden_states_scores_the_recorded_attention(lm):
    """WindowPress recomputes the window's queries from the hidden states with the module's q_proj and the rotary
    embedding kvpress passes: bit for bit the queries the model computed (the same operations on the same tensors),
    so its scores are the recorded attention's up to the softmax's rounding (tests/support/rounding.py), and its kept sets
    are Window's wherever no two scores are closer than that."""
    ours = from_kvpress(WindowPress()).policy
    run = CompressedSession(lm, RunSettings(ours, Ratio(0.5), "prefill"))
    run.add_turn(PROMPT)
    at = len(run)
    candidates = Candidates(run.session, at, at // 2, torch.ones(lm.layers, lm.kv_heads, at, dtype=torch.bool),
                            hidden=run.hidden)
    theirs, native = ours.score(candidates), Window().score(candidates)
    for layer in range(lm.layers):
        queries = run.session.queries.layer(layer)[:, at - WINDOW: at]
        bound = rescored_weight_rounding(queries, run.session.layer_kv(layer)[0], lm.attention.scaling)
        assert bool(((theirs[layer] - native[layer]).abs() <= bound * native[layer] + 1e-12).all()), layer
    assert torch.equal(kept(lm, ours), kept(lm, Window()))


def test_hidden_states_are_recorded_only_in_runs_of_policies_that_read_them(lm):
    assert CompressedSession(lm, RunSettings(KeyNorm(), 8, "prefill")).hidden is None
    session = Session(lm)
    session.add_user_turn(PROMPT)
    # a one-shot decision (the what-if) computes them with one forward pass over the conversation
    assert from_kvpress(NormPress()).policy.edit(session, 0.5) == KeyNorm(ties="topk").edit(session, 0.5)
    session.commit(KeyNorm().edit(session, 0.5))  # an edited cache: the inputs it saw are not the conversation's
    with pytest.raises(KvvizError, match="an edited cache changed"):
        from_kvpress(NormPress()).policy.edit(session, 0.5)
    with pytest.raises(KvvizError, match="is not a kvpress press"):
        from_kvpress(type("Thing", (), {"score": None}))  # no score method: not a press in kvpress' shape


# kvpress itself, installed beside kvviz (requirements-kvpress.txt), its presses run unchanged


def test_kvpress_presses_run_through_their_own_code_keep_what_the_native_policies_keep(lm):
    """The native policies keep what kvpress keeps (docs/kvpress.md's parity table, measured against kvpress in its own
    environment); kvpress' own classes run through its compress / forward_hook seam must keep the same sets."""
    kvpress = own_code.kvpress()
    for press, native in ((kvpress.KnormPress(), from_kvpress("KnormPress")),
                          (kvpress.StreamingLLMPress(n_sink=2), from_kvpress("StreamingLLMPress", n_sink=2)),
                          (kvpress.SnapKVPress(window_size=8, kernel_size=3),
                           from_kvpress("SnapKVPress", window_size=8, kernel_size=3))):
        own = from_press(press)
        assert isinstance(own.policy, own_code.PressCode)
        assert torch.equal(kept(lm, own.policy), kept(lm, native.policy)), type(press).__name__


def test_kvviz_computes_the_same_under_kvpress_own_attention_patch(make_chat):
    """A notebook that runs ``import kvpress`` itself gets kvpress' patch: every registered attention function, kvviz's
    too, wrapped by one that passes ``dropout`` on by position. A prefill, decode steps and a what-if under it give
    bit for bit what they give without it (the wrapper changes nothing when no press set masked keys: the same
    kernels on the same inputs)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from kvviz import Edit, what_if
    from kvviz.recorder import ATTENTION_NAME

    kvpress = own_code.kvpress()
    runs = []
    for patched in (False, True):
        session = make_chat(PROMPT, generate=3)
        if patched:
            kvpress.attention_patch.patch_attention_functions()
        try:
            assert (ALL_ATTENTION_FUNCTIONS[ATTENTION_NAME].__module__ == "kvpress.attention_patch") == patched
            session.add_user_turn("And who keeps bees?")
            session.generate(4)
            result = what_if(session, Edit.evict([2, 5, 9]))
        finally:
            own_code.unpatch()
        runs.append(([slot.id for slot in session.transcript.slots], result.next_token.kl,
                     [(c.id, c.prob) for c in result.next_token.edited]))
    assert runs[0] == runs[1]


PRESS_FILE = """from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class FarKeysPress(ScorerPress):
    compression_ratio: float = 0.0
    power: float = 1.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        norms = keys.norm(dim=-1)
        return (norms - norms.mean(-1, keepdim=True)).abs() ** self.power
"""


def test_a_press_file_written_against_kvpress_runs_unchanged(lm, tmp_path):
    """A ScorerPress subclass in the user's own file: named by --press-file (and KVVIZ_POLICIES) its arguments are the
    policy's fields; what it keeps equals kvpress' ScorerPress.compress written out here (topk of its score)."""
    path = tmp_path / "my_press.py"
    path.write_text(PRESS_FILE)
    classes = load(f"{path}:FarKeysPress", label="--press-file")
    policy = policy_named(classes, "FarKeysPress", {"power": "2"})
    assert policy.settings() == {"power": 2.0}
    run = CompressedSession(lm, RunSettings(policy, Ratio(0.5), "prefill"))
    run.add_turn(PROMPT)
    at = run.prompt_end[0]
    for layer in range(lm.layers):
        norms = run.session.layer_kv(layer)[0][:, :at].norm(dim=-1)  # (KV, at): every slot is still in the cache
        scores = (norms - norms.mean(-1, keepdim=True)).abs() ** 2
        expected = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(int(at * 0.5)).indices, True)
        assert torch.equal(run.alive()[layer, :, :at], expected), layer


def test_bad_presses_are_refused_in_one_line_and_change_nothing(lm, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import kvpress\nraise RuntimeError('half written')\n")
    with pytest.raises(KvvizError, match="--press-file: cannot import .*half written"):
        load(f"{broken}:X", label="--press-file")
    plain = tmp_path / "plain.py"
    plain.write_text("class NotAPress:\n    pass\n")
    with pytest.raises(KvvizError, match="is not a Policy dataclass .* or a kvpress press"):
        load(f"{plain}:NotAPress", label="--press-file")
    kvpress = own_code.kvpress()

    class Raising(kvpress.ScorerPress):
        def score(self, *args):
            raise ValueError("my bug")

    class Doubling(kvpress.BasePress):  # changes the cache's contents
        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            return keys * 2, values

    session = Session(lm)
    session.add_user_turn(PROMPT)
    length, version = len(session), session.version
    for press, message in ((Raising(compression_ratio=0.5), "Raising failed in layer 0: ValueError: my bug"),
                           (Doubling(), "changes the cache's contents")):
        with pytest.raises(KvvizError, match=message):
            from_press(press).policy.edit(session, Ratio(0.5))
    assert len(session) == length and session.version == version and not session.commits.stack
    with pytest.raises(KvvizError, match="KVgradPress: it replays the context"):
        from_kvpress("KVgradPress", compression_ratio=0.5)
    with pytest.raises(KvvizError, match="QFilterPress needs query filters"):
        from_kvpress("QFilterPress", compression_ratio=0.5)


def test_a_decoding_press_runs_on_a_mirror_of_kvpress_cache(lm):
    """kvpress' own DecodingPress(KnormPress, every 3 steps, to 24 slots), step by step. The reference is written out
    here from kvpress' rule: after every 3rd step each layer and KV head keeps the 24 largest-score slots of what it
    held (score −‖k‖), ties as torch.topk breaks them over the cache in kvpress' order — which the mirror reproduces,
    so the reference runs topk over the same order. Between compressions the cache grows by one slot per step."""
    kvpress = own_code.kvpress()
    press = from_press(kvpress.DecodingPress(base_press=kvpress.KnormPress(), compression_interval=3, target_size=24))
    assert press.mode == "decode" and press.policy.decides_count
    run = CompressedSession(lm, RunSettings(press.policy, press.ratio, press.mode, press.every))
    run.add_turn(PROMPT)
    prompt = len(run)
    order = [torch.arange(prompt).expand(lm.kv_heads, -1) for _ in range(lm.layers)]  # kvpress' rows, as slots
    for step in range(8):
        run.step()
        mirror = run.scratch["kvpress_mirror"]
        for layer in range(lm.layers):  # the step's decision saw slots up to the one this step processed
            grown = torch.cat([order[layer], torch.full((lm.kv_heads, 1), prompt + step - 1)], -1) if step else order[layer]
            if step and step % 3 == 0:
                norms = run.session.layer_kv(layer)[0].gather(1, grown[..., None].expand(-1, -1, lm.head_dim)).norm(dim=-1)
                grown = grown.gather(-1, (-norms).topk(24, dim=-1).indices)
            order[layer] = grown
            assert torch.equal(mirror.slots[layer], grown), (step, layer)
        seen = run.seen.sum(-1)  # what the step attended to besides itself
        assert bool((seen == order[0].shape[-1]).all()), step
