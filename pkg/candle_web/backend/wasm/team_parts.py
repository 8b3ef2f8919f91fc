"""The parts on two threads (`kernels-threads.wasm`, team.py): LLaMA's and
Whisper's whole decode step, and Whisper's encoder for one window, as one team job each, with
the weights resident in the team's shared memory.

Each part wraps the one-thread part of parts.py (which checks that the weights
fit and prepares them: f16 bits, GGML pieces) and copies its arrays into the shared memory
once. A step then copies in the hidden state (and the rotary rows), runs every block and the
vocabulary projection in one `team_run`, and copies out the logits and the step's new keys and
values, which it writes into the model's own KV caches: those stay the one KV cache both the
generic path and the parts read (nn/kv_cache.py). The team keeps a mirror of each cache in
the shared memory; a cache buffer only ever grows by appending (a reset, a reorder or a
growth makes a new array), so a mirror is valid up to what it has seen of the same buffer
(the same owning array at the same address), and the positions written since by another path
are copied in before the step.

The numbers are the one-thread part's: the same kernels, each output row computed by one
thread exactly as one thread computes it (web/kernels/team.h).
"""

from __future__ import annotations

import math
import warnings
import weakref

import numpy as np

from . import abi
from . import parts as one_thread
from .team import TeamMemoryFull

_F32 = np.dtype(np.float32)


class _Ledger:
    """A part's view of the team host that remembers what the part allocated, so that all of
    it goes back to the arena when the part is collected (a model dropped or replaced: the
    shared memory holds a copy of every weight) or when building it failed half-way."""

    def __init__(self, team):
        self.host = team
        self.offsets: set[int] = set()
        self.write, self.read, self.run = team.write, team.read, team.run

    def alloc(self, nbytes: int) -> int:
        offset = self.host.alloc(nbytes)
        self.offsets.add(offset)
        return offset

    def put(self, array) -> int:
        offset = self.host.put(array)
        self.offsets.add(offset)
        return offset

    def release(self, offset: int) -> None:
        self.offsets.discard(offset)
        self.host.release(offset)

    def release_all(self) -> None:
        for offset in sorted(self.offsets):
            self.host.release(offset)
        self.offsets.clear()


class _ArgBlock:
    """An argument block (a header, then one record per block) as an int32 array, filled by
    field name from the abi.py layout tables; floats are stored as their f32 bits."""

    def __init__(self, header: tuple, record: tuple, records: int):
        self.header_index = {name: i for i, (name, _) in enumerate(header)}
        self.header_kind = dict(header)
        self.record_index = {name: i for i, (name, _) in enumerate(record)}
        self.record_kind = dict(record)
        self.header_words = len(header)
        self.record_words = len(record)
        self.words = np.zeros(self.header_words + records * self.record_words, np.int32)
        self._floats = self.words.view(np.float32)

    def _set(self, index: int, kind: str, value) -> None:
        if kind == "f":
            self._floats[index] = value
        else:
            self.words[index] = 0 if value is None else int(value)

    def set(self, **fields) -> None:
        for name, value in fields.items():
            self._set(self.header_index[name], self.header_kind[name], value)

    def set_record(self, record: int, **fields) -> None:
        base = self.header_words + record * self.record_words
        for name, value in fields.items():
            self._set(base + self.record_index[name], self.record_kind[name], value)


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns `array`'s memory (a cache hands out views of its buffer)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class _CacheMirror:
    """One (keys, values) cache pair's copy in the shared memory. It belongs to the cache's
    buffers: the arrays that own the views passed (the model passes a new view per step) and
    the views' addresses."""

    def __init__(self, team, keys: np.ndarray, values: np.ndarray):
        self.team = team
        self.key = self._identity(keys, values)
        self.owners = (weakref.ref(_owner(keys)), weakref.ref(_owner(values)))
        self.keys = team.alloc(keys.nbytes)
        self.values = team.alloc(values.nbytes)
        self.synced = 0  # positions [0, synced) equal the numpy buffers'

    @staticmethod
    def _identity(keys, values) -> tuple:
        return (keys.shape, keys.__array_interface__["data"][0],
                values.__array_interface__["data"][0])

    def matches(self, keys, values) -> bool:
        return (self.owners[0]() is _owner(keys) and self.owners[1]() is _owner(values)
                and self._identity(keys, values) == self.key)

    def sync(self, keys: np.ndarray, values: np.ndarray, pos: int) -> None:
        """Positions [0, pos) as in the numpy buffers (what another path wrote since)."""
        if self.synced < pos:
            # Whole buffers: one copy each (the positions past `pos` are not read).
            self.team.write(self.keys, keys)
            self.team.write(self.values, values)
        self.synced = pos

    def release(self) -> None:
        self.team.release(self.keys)
        self.team.release(self.values)


def _mirror(team, mirrors: list, index: int, keys, values, pos: int) -> _CacheMirror:
    mirror = mirrors[index]
    if mirror is None or not mirror.matches(keys, values):
        if mirror is not None:
            # Forgotten before it is released: a cancel (KeyboardInterrupt) landing in between
            # leaks a block instead of releasing it twice at the next step.
            mirrors[index] = None
            mirror.release()
        if not (keys.flags.c_contiguous and values.flags.c_contiguous
                and keys.dtype == _F32 and values.dtype == _F32):
            raise ValueError("team decode step: KV caches must be C-ordered float32")
        mirror = mirrors[index] = _CacheMirror(team, keys, values)
    mirror.sync(keys, values, pos)
    return mirror


class _Buffers:
    """Named activation buffers in the shared memory, grown (never shrunk) on demand."""

    def __init__(self, team):
        self.team = team
        self._blocks = {}  # name -> (offset, bytes)

    def get(self, name: str, nbytes: int) -> int:
        held = self._blocks.get(name)
        if held is None or held[1] < nbytes:
            if held is not None:
                del self._blocks[name]  # forgotten first (see _mirror)
                self.team.release(held[0])
            held = self._blocks[name] = (self.team.alloc(nbytes), nbytes)
        return held[0]


def _ledger(part, team) -> _Ledger:
    ledger = _Ledger(team)
    weakref.finalize(part, ledger.release_all)
    return ledger


def _put(team, array) -> int:
    """The array's copy in the shared memory, 0 (absent) for None."""
    return 0 if array is None else team.put(array)


# -- LLaMA ----------------------------------------------------------------------------------------
class TeamLlamaDecoderStep:
    """`llama.decoder_step` on two threads: all blocks and the vocabulary projection in one
    team job per token."""

    def __init__(self, backend, weights, team):
        base = one_thread.LlamaDecoderStep(backend, weights)  # raises UnfitWeights
        self.team = team = _ledger(self, team)
        put = team.put
        w = weights
        hd, nh, nkv = w.head_dim, w.num_heads, w.num_kv_heads
        d = base.norm.shape[0]
        self.d, self.hd, self.nkv, self.half = d, hd, nkv, hd // 2
        self.args = _ArgBlock(abi.TEAM_LLAMA_HEADER, abi.TEAM_LLAMA_LAYER,
                              len(base.layers))
        for i, (attn_norm, mlp_norm, eps, qkv, bias, out, gate_up, down) in enumerate(
                base.layers):
            (qt, qr, qw), (kt, kr, kw), (vt, vr, vw) = _pieces(qkv, 3)
            (gt, gr, gw), (ut, ur, uw) = _pieces(gate_up, 2)
            ot, ow = out.single
            dt, dw = down.single
            self.args.set_record(
                i, attn_norm=put(attn_norm), mlp_norm=put(mlp_norm), eps=eps,
                q_type=qt, q_rows=qr, q_w=_put(team, qw),
                k_type=kt, k_rows=kr, k_w=_put(team, kw),
                v_type=vt, v_rows=vr, v_w=_put(team, vw), qkv_b=_put(team, bias),
                o_type=ot, o_w=put(ow), g_type=gt, g_rows=gr, g_w=_put(team, gw),
                u_type=ut, u_rows=ur, u_w=_put(team, uw), down_type=dt,
                down_w=put(dw))
        head_type, head_w = base.head.single
        self.vocab = base.head.n
        self.layers = len(base.layers)
        self.x = team.alloc(d * 4)
        # the block's work, then the second thread's own d floats (its rms_norm output)
        self.work = team.alloc(base.work.nbytes + d * 4)
        self.cos_row = team.alloc(self.half * 4)
        self.sin_row = team.alloc(self.half * 4)
        self.kv_out = team.alloc(self.layers * 2 * nkv * hd * 4)
        self.logits = team.alloc(self.vocab * 4)
        self.args.set(d=d, n_heads=nh, n_kv=nkv, head_dim=hd, ffn=base.ffn,
                      interleaved=1 if w.rope_interleaved else 0, scale=base.scale,
                      n_layers=self.layers, layer_words=self.args.record_words, x=self.x,
                      work=self.work, cos_row=self.cos_row, sin_row=self.sin_row,
                      kv_out=self.kv_out, norm=put(base.norm), norm_eps=w.norm_eps,
                      head_type=head_type, vocab=self.vocab, logits=self.logits,
                      head_w=put(head_w))
        self.args_offset = team.alloc(self.args.words.nbytes)
        self.kv_stage = np.empty((self.layers, 2, nkv, hd), _F32)
        self.mirrors = [None] * self.layers
        self.threads_used = 0  # threads of the last step (1: the helper was not there)

    @staticmethod
    def build(backend, weights, team):
        try:
            return TeamLlamaDecoderStep(backend, weights, team)
        except one_thread.UnfitWeights:
            return None

    def __call__(self, x: np.ndarray, pos: int, caches, cos: np.ndarray, sin: np.ndarray):
        team = self.team
        for i, (keys, values) in enumerate(caches):
            mirror = _mirror(team, self.mirrors, i, keys, values, pos)
            self.args.set_record(i, capacity=keys.shape[1], keys=mirror.keys,
                                 values=mirror.values)
        self.args.set(pos=pos)
        team.write(self.x, np.asarray(x, _F32).reshape(-1))
        team.write(self.cos_row, cos[pos])
        team.write(self.sin_row, sin[pos])
        team.write(self.args_offset, self.args.words)
        self.threads_used = team.run("llama_step", self.args_offset)
        logits = team.read(self.logits, np.empty(self.vocab, _F32))
        stage = team.read(self.kv_out, self.kv_stage)
        for i, (keys, values) in enumerate(caches):
            keys[:, pos] = stage[i, 0]
            values[:, pos] = stage[i, 1]
            self.mirrors[i].synced = pos + 1
        return logits


def _pieces(qlinear, count: int) -> list:
    """(type, rows, array) x count of a _QLinear, absent pieces as (0, 0, None)."""
    flat = qlinear.slots(count)
    return [flat[3 * i:3 * i + 3] for i in range(count)]


# -- Whisper --------------------------------------------------------------------------------------
class TeamWhisperDecoderStep:
    """`whisper.decoder_step` on two threads: every block and the vocabulary projection of one
    token per row in one team job; the cross K/V of an audio are copied in once."""

    def __init__(self, backend, weights, team):
        base = one_thread.WhisperDecoderStep(backend, weights)  # raises UnfitWeights
        self.base = base
        self.team = team = _ledger(self, team)
        put = lambda array: _put(team, array)  # noqa: E731  (an absent bias: 0)
        self.embedding = base.embedding
        self.positions = base.positions
        self.blocks = base.blocks
        self.args = _ArgBlock(abi.TEAM_WHISPER_HEADER, abi.TEAM_WHISPER_BLOCK,
                              len(base.blocks))
        for i, block in enumerate(base.blocks):
            ln1, ln2, ln3 = block.attn_ln, block.cross_ln, block.mlp_ln

            def matrix(linear):
                kind, array = linear.matrix
                return kind, put(array), put(linear.bias)

            qkv, out, cq = matrix(block.qkv), matrix(block.attn_out), matrix(block.cross_q)
            co, fc1, fc2 = matrix(block.cross_out), matrix(block.fc1), matrix(block.fc2)
            self.args.set_record(
                i, ln1_w=put(ln1[0]), ln1_b=put(ln1[1]), qkv_type=qkv[0], qkv_w=qkv[1],
                qkv_b=qkv[2], out_type=out[0], out_w=out[1], out_b=out[2], ln2_w=put(ln2[0]),
                ln2_b=put(ln2[1]), cq_type=cq[0], cq_w=cq[1], cq_b=cq[2], co_type=co[0],
                co_w=co[1], co_b=co[2], ln3_w=put(ln3[0]), ln3_b=put(ln3[1]),
                fc1_type=fc1[0], fc1_w=fc1[1], fc1_b=fc1[2], fc2_type=fc2[0], fc2_w=fc2[1],
                fc2_b=fc2[2])
        ln_w, ln_b, ln_eps = base.ln
        head_type, head_w = base.projection.matrix
        self.vocab = base.projection.n
        self.d = self.embedding.shape[1]
        self.ffn = base.blocks[0].fc1.n
        self.n_head = base.blocks[0].n_head
        self.args.set(d=self.d, n_head=self.n_head, ffn=self.ffn, eps=base.blocks[0].attn_ln[2],
                      scale=1.0 / math.sqrt(self.d // self.n_head), n_blocks=len(base.blocks),
                      block_words=self.args.record_words, ln_w=put(ln_w), ln_b=put(ln_b),
                      head_type=head_type, head_w=put(head_w), vocab=self.vocab, ln_eps=ln_eps)
        self.args_offset = team.alloc(self.args.words.nbytes)
        self.buffers = _Buffers(team)
        self.mirrors = [None] * len(base.blocks)
        self._cross = None  # (the base's cross K/V list, [(keys, values) offsets])
        self.threads_used = 0
        # The base part stays for its cross K/V projection of each audio (_cross_kv); the
        # matrices copied into the shared memory above are dropped from it (a second copy of
        # the decoder in Pyodide's heap otherwise; its f16 bits are copies of the model's).
        for block in base.blocks:
            block.qkv = block.attn_out = block.cross_q = block.cross_out = None
            block.fc1 = block.fc2 = None
        base.projection = None

    @staticmethod
    def build(backend, weights, team):
        try:
            return TeamWhisperDecoderStep(backend, weights, team)
        except one_thread.UnfitWeights:
            return None

    def _cross_kv(self, features: np.ndarray) -> list:
        cross = self.base._cross_kv(features)
        if self._cross is None or self._cross[0] is not cross:
            # The old copies are forgotten before they are released: a cancel landing in the
            # middle (the page interrupts Python anywhere) then leaks blocks rather than
            # releasing them again at the next audio ("team arena: ... is not an allocated
            # block", seen after a transcription was cancelled mid-way).
            old, self._cross = self._cross, None
            if old is not None:
                for k, v in old[1]:
                    self.team.release(k)
                    self.team.release(v)
            self._cross = (cross, [(self.team.put(k), self.team.put(v)) for k, v in cross])
        return self._cross[1]

    def step(self, token_ids, position: int, caches, features, with_logits: bool = True):
        """As one_thread.WhisperDecoderStep.step."""
        team = self.team
        ids = np.asarray(token_ids, dtype=np.intp).reshape(-1)
        rows = ids.shape[0]
        d = self.d
        x = self.embedding[ids] + self.positions[position]  # [R, d]
        cross = self._cross_kv(features)
        base_cross = self._cross[0]
        n_audio = base_cross[0][0].shape[2]
        audio_rows = base_cross[0][0].shape[0]
        if audio_rows not in (1, rows):
            raise ValueError(f"whisper decoder step: {audio_rows} audio rows for {rows} token "
                             "rows")
        cross_bs = base_cross[0][0][0].size if audio_rows > 1 else 0
        for i, ((keys, values), (cross_k, cross_v)) in enumerate(zip(caches, cross)):
            mirror = _mirror(team, self.mirrors, i, keys, values, position)
            self.args.set_record(i, capacity=keys.shape[2], keys=mirror.keys,
                                 values=mirror.values, cross_k=cross_k, cross_v=cross_v)
        buffers = self.buffers
        x_offset = buffers.get("x", rows * d * 4)
        logits_offset = buffers.get("logits", rows * self.vocab * 4) if with_logits else 0
        kv_out = buffers.get("kv_out", len(self.blocks) * rows * 2 * d * 4)
        self.args.set(r=rows, pos=position, n_audio=n_audio, cross_bs=cross_bs, x=x_offset,
                      work=buffers.get("work", rows * (6 * d + self.ffn) * 4), kv_out=kv_out,
                      logits=logits_offset)
        team.write(x_offset, x.astype(_F32, copy=False))
        team.write(self.args_offset, self.args.words)
        self.threads_used = team.run("whisper_step", self.args_offset)
        stage = team.read(kv_out, np.empty((len(self.blocks), rows, 2, self.n_head,
                                            d // self.n_head), _F32))
        for i, (keys, values) in enumerate(caches):
            keys[:, :, position] = stage[i, :, 0]
            values[:, :, position] = stage[i, :, 1]
            self.mirrors[i].synced = position + 1
        if not with_logits:
            return None
        return team.read(logits_offset, np.empty((rows, self.vocab), _F32))


class TeamWhisperEncoder:
    """`whisper.encoder` on two threads: the convolutions and every block of one audio window
    in one team job (whisper_steps.c: whisper_encoder_team_step); the weights are copied in
    once."""

    def __init__(self, backend, weights, team):
        base = one_thread.WhisperEncoder(backend, weights)  # raises UnfitWeights
        self.team = team = _ledger(self, team)
        put = lambda array: _put(team, array)  # noqa: E731  (an absent bias: 0)
        (taps1, bias1), (taps2, bias2) = base.convs
        self.n_mels = taps1[0].k
        self.d = taps1[0].n
        self.n_head = base.blocks[0].n_head
        self.ffn = base.blocks[0].fc1.n
        self.positions = base.positions
        self.args = _ArgBlock(abi.TEAM_ENCODER_HEADER, abi.TEAM_ENCODER_BLOCK,
                              len(base.blocks))
        for i, block in enumerate(base.blocks):
            ln1, ln2 = block.attn_ln, block.mlp_ln
            self.args.set_record(
                i, ln1_w=put(ln1[0]), ln1_b=put(ln1[1]), ln1_eps=ln1[2],
                qkv_w=put(block.qkv.weight), qkv_b=put(block.qkv.bias),
                out_w=put(block.attn_out.weight), out_b=put(block.attn_out.bias),
                ln2_w=put(ln2[0]), ln2_b=put(ln2[1]), ln2_eps=ln2[2],
                fc1_w=put(block.fc1.weight), fc1_b=put(block.fc1.bias),
                fc2_w=put(block.fc2.weight), fc2_b=put(block.fc2.bias))
        ln_w, ln_b, ln_eps = base.ln_post
        self.args.set(n_mels=self.n_mels, d=self.d, n_head=self.n_head, ffn=self.ffn,
                      n_blocks=len(base.blocks), block_words=self.args.record_words,
                      conv1_w=put(np.stack([tap.weight for tap in taps1])), conv1_b=put(bias1),
                      conv2_w=put(np.stack([tap.weight for tap in taps2])), conv2_b=put(bias2),
                      positions=put(self.positions), ln_w=put(ln_w), ln_b=put(ln_b),
                      ln_eps=ln_eps, scale=1.0 / math.sqrt(self.d // self.n_head))
        self.args_offset = team.alloc(self.args.words.nbytes)
        self.buffers = _Buffers(team)
        self.threads_used = 0

    @staticmethod
    def build(backend, weights, team):
        try:
            return TeamWhisperEncoder(backend, weights, team)
        except one_thread.UnfitWeights:
            return None

    def __call__(self, mel: np.ndarray) -> np.ndarray:
        """mel [b, n_mels, frames] -> features [b, frames // 2, d] (after ln_post)."""
        return np.stack([self._one(m) for m in mel])

    def _one(self, mel: np.ndarray) -> np.ndarray:
        team = self.team
        frames_in = mel.shape[1]
        frames = (frames_in - 1) // 2 + 1
        if mel.shape[0] != self.n_mels or frames > self.positions.shape[0]:
            raise ValueError(f"whisper encoder: mel {list(mel.shape)} does not fit "
                             f"{self.n_mels} mels and {self.positions.shape[0]} positions")
        padded = np.zeros((frames_in + 2, self.n_mels), _F32)
        padded[1:-1] = mel.T
        buffers = self.buffers
        mel_offset = buffers.get("mel", padded.nbytes)
        out_offset = buffers.get("out", frames * self.d * 4)
        work = buffers.get("work", 4 * abi.team_encoder_work_floats(frames_in, self.d,
                                                                          self.ffn))
        self.args.set(frames_in=frames_in, mel=mel_offset, out=out_offset, work=work)
        team.write(mel_offset, padded)
        team.write(self.args_offset, self.args.words)
        self.threads_used = team.run("whisper_encoder", self.args_offset)
        return team.read(out_offset, np.empty((frames, self.d), _F32))


_TEAM_CLASSES = {one_thread.LlamaDecoderStep: TeamLlamaDecoderStep,
                 one_thread.WhisperDecoderStep: TeamWhisperDecoderStep,
                 one_thread.WhisperEncoder: TeamWhisperEncoder}


def build(backend, cls, weights):
    """The two-thread version of parts.py's part class `cls` on backend.team, or None (no
    such version, the weights do not fit, or the shared memory cannot hold them: the
    one-thread part runs then, and a warning says why)."""
    team_cls = _TEAM_CLASSES.get(cls)
    if team_cls is None or backend.team is None:
        return None
    try:
        return team_cls.build(backend, weights, backend.team)
    except TeamMemoryFull as error:  # what the half-built part took is released with it
        warnings.warn(f"{team_cls.__name__}: one thread runs instead: {error}", stacklevel=2)
        return None
