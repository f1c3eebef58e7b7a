"""TinyMAR through the MARPolicy protocol: replay, recompute == rollout, save/load, errors."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from margrpo.models.chains import guided_output, recompute_log_probs
from margrpo.models.loading import load_model, new_model, save_base, tiny_config
from margrpo.models.mar import TinyMAR, mask_schedule
from margrpo.models.protocol import MARPolicy
from margrpo.models.samplers import FlowSDESampler
from margrpo.models.tokenizer import NULL_ID, PAD_ID, WordTokenizer
from margrpo.world.grammar import VOCAB

from conftest import randomize_head, tiny_params

PROMPTS = ["a red circle", "two squares", "a blue triangle left of a circle", "a striped square and a solid circle"]


def as_policy(model) -> MARPolicy:
    assert isinstance(model, MARPolicy)
    return model


@pytest.mark.parametrize("sampler", ["ddpm", "flow"])
def test_recompute_equals_rollout(sampler):
    params = tiny_params(**{"model.sampler": sampler})
    policy = as_policy(randomize_head(new_model(params, VOCAB)))
    ro = policy.rollout(PROMPTS, generator=torch.Generator().manual_seed(3), speculative_steps=[1])
    steps = range(len(ro.steps))  # n_i differs between steps: one step at a time
    with torch.no_grad():
        diff = [(recompute_log_probs(policy, ro, [i])[0] - ro.steps[i].logp).abs().max().item() for i in steps]
    assert max(s.logp.abs().max().item() for s in ro.steps) > 1.0  # non-trivial log-probs
    assert max(diff) <= 1e-4
    # Changing the parameters changes the log-probs: the check above can fail.
    with torch.no_grad():
        for p in policy.ar_parameters():
            p.add_(0.1 * torch.randn_like(p))
        moved = recompute_log_probs(policy, ro, [1])[0]
    assert (moved - ro.steps[1].logp).abs().max().item() > 1e-3


def test_same_seed_same_images_and_replay_by_seed(tiny_model):
    a = tiny_model.rollout(PROMPTS, generator=torch.Generator().manual_seed(7))
    b = tiny_model.rollout(PROMPTS, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.images, b.images)
    # One image replayed alone from its recorded seed, and with speculative predictions on.
    c = tiny_model.rollout(PROMPTS[2:3], seeds=a.seeds[2:3], speculative_steps=[0, 1, 2])
    # Same draws; only float rounding of a different batch shape differs.
    assert (c.images[0] - a.images[2]).abs().max().item() < 1e-3
    d = tiny_model.rollout(PROMPTS, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(a.images, d.images)


def test_rollout_record_shapes(tiny_model):
    ro = tiny_model.rollout(PROMPTS, generator=torch.Generator().manual_seed(0), speculative_steps=[1])
    k, t = tiny_model.num_ar_steps, tiny_model.sampler.num_steps
    assert len(ro.steps) == k and sum(s.commit_idx.shape[1] for s in ro.steps) == tiny_model.num_tokens
    s1 = ro.steps[1]
    assert s1.chain.shape[0] == t + 1 and s1.logp.shape[0] == t
    assert torch.equal(s1.chain[-1], torch.gather(ro.tokens, 1, s1.commit_idx.unsqueeze(-1).expand(-1, -1, tiny_model.token_dim)))
    assert s1.speculative.shape == ro.tokens.shape and ro.steps[0].speculative is None
    # every position committed exactly once
    order = torch.cat([s.commit_idx for s in ro.steps], 1).sort(1).values
    assert torch.equal(order, torch.arange(tiny_model.num_tokens).expand(len(PROMPTS), -1))


def test_save_load_round_trip(tmp_path, tiny_model):
    params = tiny_params()
    tiny_model.save_pretrained(tmp_path / "m")
    loaded = load_model(tmp_path / "m", params)
    for (n1, p1), (n2, p2) in zip(tiny_model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    a = tiny_model.rollout(PROMPTS[:2], seeds=torch.tensor([1, 2]))
    b = loaded.rollout(PROMPTS[:2], seeds=torch.tensor([1, 2]))
    assert torch.equal(a.images, b.images)


def test_base_checkpoint_is_float16_and_loads_float32(tmp_path, tiny_model):
    save_base(tiny_model, tmp_path / "m")
    stored = load_file(tmp_path / "m" / "diffusion_pytorch_model.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.float16}
    loaded = load_model(tmp_path / "m", tiny_params())
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    for p1, p2 in zip(tiny_model.parameters(), loaded.parameters()):
        torch.testing.assert_close(p2, p1, rtol=2**-10, atol=1e-6)
    assert {p.dtype for p in tiny_model.parameters()} == {torch.float32}  # the caller's model is untouched


def test_checkpoint_mismatch_is_named(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="width: params.yaml says 64, checkpoint has 32"):
        load_model(tmp_path / "m", tiny_params(**{"model.width": 64}))
    # the flow shift changes what the head was trained on, so it is checked like the arch
    with pytest.raises(ValueError, match="flow_shift: params.yaml says 1.0, checkpoint has 3.0"):
        load_model(tmp_path / "m", tiny_params(**{"model.flow_shift": 1.0}))
    with pytest.raises(FileNotFoundError, match="nothing: no such folder"):
        load_model(tmp_path / "nothing", tiny_params())


def test_truncated_checkpoint_names_the_file(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="diffusion_pytorch_model.safetensors: tensors end at byte"):
        load_model(tmp_path / "m", tiny_params())


def test_bad_inputs_are_clear(tiny_model):
    with pytest.raises(ValueError, match="unknown word 'dog'"):
        tiny_model.rollout(["a dog"])
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        TinyMAR(**{**tiny_config(tiny_params(), ["a"]), "image_size": 30})
    with pytest.raises(ValueError, match="AR steps must be in"):
        mask_schedule(16, 17)
    with pytest.raises(ValueError, match="seeds must have shape"):
        tiny_model.rollout(PROMPTS, seeds=torch.tensor([1]))


def test_word_tokenizer_over_the_world_vocabulary():
    tok = WordTokenizer(VOCAB, 16)
    assert VOCAB[PAD_ID] == "<pad>" and VOCAB[NULL_ID] == "<null>"
    ids = tok.encode("a red circle left of a square")
    assert len(ids) == 16 and ids[7:] == [PAD_ID] * 9 and ids[0] == VOCAB.index("a")
    assert tok.decode(ids) == "a red circle left of a square"
    assert tok.encode("") == [NULL_ID] + [PAD_ID] * 15
    assert tok(["a red circle", ""]).shape == (2, 16)


def test_word_tokenizer_errors():
    tok = WordTokenizer(VOCAB, 16)
    with pytest.raises(ValueError, match="'dog'.*vocabulary"):
        tok.encode("a dog")
    with pytest.raises(ValueError, match="'<pad>'"):
        tok.encode("a <pad> circle")
    with pytest.raises(ValueError, match="max_len=4"):
        WordTokenizer(VOCAB, 4).encode("a red circle and a square")
    with pytest.raises(ValueError, match="pad token, a null token"):
        WordTokenizer(["<pad>", "<null>"], 4)


def test_mask_schedule_is_cosine_and_complete():
    for n, k in [(16, 16), (16, 8), (64, 16), (16, 1)]:
        c = mask_schedule(n, k)
        assert sum(c) == n and len(c) == k and min(c) >= 1
    assert mask_schedule(64, 8)[0] < mask_schedule(64, 8)[-1]  # few early, many late


def test_training_loss_decreases_on_one_batch(tiny_model):
    from margrpo.world.data import WorldBatches

    gen = torch.Generator().manual_seed(0)
    images, prompts = WorldBatches(32).sample(8, gen)
    ids = tiny_model.tokenize(prompts)
    pre = tiny_params().pretrain
    opt = torch.optim.Adam(tiny_model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = tiny_model.training_loss(images, ids, torch.Generator().manual_seed(1), pre.prompt_dropout,
                                        pre.diffusion_batch_mul)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_pretrain_lr_is_warmup_stable_decay():
    from margrpo.config import PretrainConfig
    from margrpo.models.pretrain import lr_at

    s = PretrainConfig(steps=1000, lr=1e-3, warmup_steps=100, decay_steps=200)
    lrs = [lr_at(i, s) for i in range(s.steps)]
    assert lrs[0] == pytest.approx(1e-5) and lrs[99] == pytest.approx(1e-3)
    assert all(x == pytest.approx(1e-3) for x in lrs[100:800])  # stable part
    assert lrs[899] == pytest.approx(1e-3 * 101 / 200) and 0 < lrs[-1] <= 1e-3 / 200
    assert all(a >= b for a, b in zip(lrs[800:], lrs[801:]))
    # no decay: the stable part never ends, so a stopped run equals a shorter one
    assert lr_at(999, PretrainConfig(steps=1000, warmup_steps=100, decay_steps=0)) == 1e-3


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_flow_shift_maps_sampling_and_training_sigmas_alike(shift):
    """Sampling grid and training noise levels both follow sigma = s*u / (1 + (s-1)*u)."""
    warp = lambda u: shift * u / (1.0 + (shift - 1.0) * u)
    plain, shifted = FlowSDESampler(20, shift=1.0), FlowSDESampler(20, shift=shift)
    # diffusers also shifts the grid's last sigma (1e-3 -> 3e-3 at shift 3), hence 0.01
    torch.testing.assert_close(shifted.sigmas, warp(plain.sigmas), atol=0.01, rtol=0)
    u = torch.rand(512, generator=torch.Generator().manual_seed(3))
    _, sigma, _ = shifted.training_pair(torch.zeros(512, 4), torch.Generator().manual_seed(3))
    torch.testing.assert_close(sigma, warp(u))
    if shift > 1:  # more time at high noise, where colour and layout are decided
        assert (shifted.sigmas[1:-1] > plain.sigmas[1:-1]).all()


def test_cfg_null_gradient_modes(tiny_model):
    """guided and guided_full give the same mean; only guided_full back-propagates into the
    null-prompt branch, and its gradient is the exact one: w dc + (1 - w) du."""
    torch.manual_seed(0)
    x = torch.randn(3, tiny_model.token_dim)
    z_c = torch.randn(3, tiny_model.config.cond_dim, requires_grad=True)
    z_u = torch.randn(3, tiny_model.config.cond_dim, requires_grad=True)
    w = 3.0
    outs = {m: guided_output(tiny_model, x, 2, z_c, z_u, w, m) for m in ("guided", "guided_full")}
    torch.testing.assert_close(outs["guided"], outs["guided_full"])
    (gu_detached,) = torch.autograd.grad(outs["guided"].sum(), [z_u], allow_unused=True)
    assert gu_detached is None or not gu_detached.any()
    gc, gu = torch.autograd.grad(outs["guided_full"].sum(), [z_c, z_u])
    t = torch.full((3,), tiny_model.sampler.time_input(2))
    (ref_u,) = torch.autograd.grad(tiny_model.head_output(x, t, z_u).sum(), [z_u])
    (ref_c,) = torch.autograd.grad(tiny_model.head_output(x, t, z_c).sum(), [z_c])
    torch.testing.assert_close(gu, (1 - w) * ref_u)
    torch.testing.assert_close(gc, w * ref_c)
