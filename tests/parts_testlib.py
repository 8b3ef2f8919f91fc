"""Small random Whisper decoders and the decode runs that compare an accelerated part (numba's,
wasm's) with the numpy backend's generic path and its float64 truth. Imported as
`tests.<module>` (see tests/__init__.py)."""

from __future__ import annotations

import numpy as np


def random_text_decoder(device, rng, d=64, n_head=4, n_blocks=2, vocab=97, n_ctx=24, d_ff=256,
                        dtype=np.float32):
    """A small random decoder; with dtype float64, the same (f32-valued) weights in float64."""
    from candle_web import Tensor
    from candle_web.models.whisper import Mlp, MultiHeadAttention, ResidualAttentionBlock, TextDecoder
    from candle_web.nn.layers import LayerNorm, Linear

    def t(*shape, scale=0.2, offset=0.0):
        values = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        return Tensor.from_numpy(values.astype(dtype), device=device)

    def linear(n_out, n_in):
        return Linear(t(n_out, n_in), t(n_out, scale=0.05))

    def ln():
        return LayerNorm(t(d, scale=0.1, offset=1.0), t(d, scale=0.1), 1e-5)

    blocks = [ResidualAttentionBlock(
        ln(), MultiHeadAttention(n_head, out=linear(d, d), qkv=linear(3 * d, d)),
        ln(), Mlp(linear(d_ff, d), linear(d, d_ff)),
        cross_ln=ln(), cross_attn=MultiHeadAttention(n_head, out=linear(d, d), q=linear(d, d),
                                                     kv=linear(2 * d, d)))
        for _ in range(n_blocks)]
    return TextDecoder(t(vocab, d, scale=0.5), t(n_ctx, d), blocks, ln())


def decode_logits(decoder, audio, device, steps, reorder_at, fed=None):
    """Logits of a 3-token prompt for 2 rows, then one token per step (beam-like reorder once).
    Returns (logits, state, the tokens fed); `fed` replays another run's tokens, so that runs
    whose logits differ by rounding still decode the same sequence."""
    from candle_web import Tensor
    from candle_web.backend import parts

    state = parts.start_whisper_decoding(decoder, Tensor.from_numpy(audio, device=device))
    tokens = np.array([[1, 5, 7], [2, 5, 9]], dtype=np.int64)
    out = [state.logits(Tensor.from_numpy(tokens, device=device)).to_numpy()[:, -1]]
    chosen = []
    for step in range(steps):
        if fed is None:
            next_ids = np.argsort(out[-1], axis=-1)[:, -2 - step % 3][:, None].astype(np.int64)
        else:
            next_ids = fed[step]
        chosen.append(next_ids)
        if step == reorder_at:
            state.reorder([1, 1])
        out.append(state.logits(Tensor.from_numpy(next_ids, device=device)).to_numpy()[:, -1])
    return np.stack(out), state, chosen


def generic_and_truth(build, audio, steps, reorder_at):
    """(f32 logits of the numpy backend's generic path, the same in float64, the tokens fed) for
    the decoder `build(device, dtype)`."""
    from candle_web import Device

    slow = Device.cpu(backend="numpy")
    want, _, fed = decode_logits(build(slow, np.float32), audio, slow, steps, reorder_at)
    truth, _, _ = decode_logits(build(slow, np.float64), audio.astype(np.float64), slow, steps,
                                 reorder_at, fed)
    return want, truth, fed


def random_encoder(device, rng, d=64, n_head=4, n_blocks=2, n_mels=12, n_ctx=160, d_ff=256,
                   dtype=np.float32):
    from candle_web import Tensor
    from candle_web.models.whisper import AudioEncoder, Mlp, MultiHeadAttention, ResidualAttentionBlock
    from candle_web.nn.layers import LayerNorm, Linear

    def t(*shape, scale=0.2, offset=0.0):
        values = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        return Tensor.from_numpy(values.astype(dtype), device=device)  # f64: the same values

    def linear(n_out, n_in):
        return Linear(t(n_out, n_in), t(n_out, scale=0.05))

    def ln():
        return LayerNorm(t(d, scale=0.1, offset=1.0), t(d, scale=0.1), 1e-5)

    blocks = [ResidualAttentionBlock(ln(), MultiHeadAttention(n_head, out=linear(d, d), qkv=linear(3 * d, d)),
                                     ln(), Mlp(linear(d_ff, d), linear(d, d_ff)))
              for _ in range(n_blocks)]
    return AudioEncoder(t(d, n_mels, 3), t(d, scale=0.05), t(d, d, 3, scale=0.1), t(d, scale=0.05),
                        t(n_ctx, d), blocks, ln())


def encode(encoder, mel, device):
    """The encoder as a model runs it: through the backend's part when it has one."""
    from candle_web import Tensor
    from candle_web.backend import parts

    return parts.encode_audio(encoder, Tensor.from_numpy(mel, device=device)).to_numpy()


# -- what the fast path chose (backend/parts.py) ---------------------------------------------------
def whisper_decoder_part(decoder):
    """The decoder's `whisper.decoder_step` implementation on its device, or None."""
    from candle_web.backend import parts

    return parts.fast_path(parts.WHISPER_DECODER_STEP, decoder,
                           decoder.token_embedding.device).impl


def whisper_encoder_part(encoder, mel=None):
    """The encoder's `whisper.encoder` implementation, or None; with `mel`, the one the fast
    path would run on that input (None where the guards send it to the tensor path)."""
    from candle_web.backend import parts

    path = parts.fast_path(parts.WHISPER_ENCODER, encoder, encoder.conv1_w.device)
    return path.impl if mel is None else path.usable(mel, weights=(encoder.conv1_w,))


def llama_part(model):
    """The model's `llama.decoder_step` implementation on its device, or None."""
    from candle_web.backend import parts

    return parts.fast_path(parts.LLAMA_DECODER_STEP, model, model.device).impl


def ran_fused(state) -> bool:
    """Whether a Whisper decoding went through a fused step (it converted the features)."""
    from candle_web.backend import parts

    return isinstance(state, parts.FusedWhisperDecoding) and state.features is not None


def llama_steps(model, fused: bool):
    """The model's decode steps with the fast path as the decode loop chooses it, or forced
    onto the reference tensor path (for comparisons)."""
    from candle_web.backend import parts

    return parts.start_causal_decoding(model) if fused else parts.ReferenceSteps(model)


def encoder_in_float64(encoder, device):
    """A loaded encoder's weights as float64 tensors on `device`, in the same modules."""
    from candle_web import Tensor
    from candle_web.models.whisper import AudioEncoder, Mlp, MultiHeadAttention, ResidualAttentionBlock
    from candle_web.nn.layers import LayerNorm, Linear

    def wide(tensor):
        if tensor is None:
            return None
        return Tensor.from_numpy(tensor.to_numpy().astype(np.float64), device=device)

    def linear(layer):
        return Linear(wide(layer.weight), wide(layer.bias))

    def norm(layer):
        return LayerNorm(wide(layer.weight), wide(layer.bias), layer.eps)

    blocks = [ResidualAttentionBlock(
        norm(b.attn_ln),
        MultiHeadAttention(b.attn.n_head, out=linear(b.attn.out), qkv=linear(b.attn.qkv)),
        norm(b.mlp_ln), Mlp(linear(b.mlp.fc1), linear(b.mlp.fc2))) for b in encoder.blocks]
    return AudioEncoder(wide(encoder.conv1_w), wide(encoder.conv1_b).reshape(-1),
                        wide(encoder.conv2_w), wide(encoder.conv2_b).reshape(-1),
                        wide(encoder.positions), blocks, norm(encoder.ln_post))


def same_encoders(rng, backend: str, **kwargs):
    """The same random encoder on `backend`, on the numpy backend, and on the numpy backend
    in float64 (the truth the other two are measured against)."""
    from candle_web import Device

    seed = int(rng.integers(1 << 30))
    fast, numpy_device = Device.cpu(backend=backend), Device.cpu(backend="numpy")
    return (random_encoder(fast, np.random.default_rng(seed), **kwargs),
            random_encoder(numpy_device, np.random.default_rng(seed), **kwargs),
            random_encoder(numpy_device, np.random.default_rng(seed), dtype=np.float64, **kwargs))
