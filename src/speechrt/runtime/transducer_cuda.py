"""Greedy transducer decoding on the GPU, without a host round trip per step.

The same decisions as speechrt.asr.transducer.greedy (NeMo's label looping), taken one step at
a time for every item at once, with no branch on the host:
    f_t = f[b, t_b]; scores = joint(f_t, g_b); label, skip as `decide`
    blank: t_b += skip                         (g, state unchanged)
    token: record (label, t_b, skip); g_b, state_b = predict(label, state_b); t_b += skip,
           + 1 more when it is the max_symbols-th token on a frame it did not leave
Per item this is the reference's sequence of (frame, g) evaluations: its inner loop over blanks
is this loop's blank steps. A block of steps is captured once per (batch, frames)
bucket as a CUDA graph; the host replays blocks and reads one flag per block (any item still
before its end). The LSTM step is written out over nn.LSTM's own weights (one GEMM per layer
for both inputs) and the loop runs in float32, so its decisions are the reference's up to
float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.models.parakeet import ParakeetTransducer
from speechrt.runtime import transducer_step
from speechrt.runtime.cuda import allow_recompiles

SCAN_BATCH = 8  # batches up to this size skip blanks in one pass per token (scan)
# steps per replayed block (one host read each): the scan emits a token per step, so shorter
# blocks run fewer steps past the end (tdt-0.6b-v2, batch 1, H200: 4.61 ms in blocks of 8,
# 4.91 in blocks of 16; batch 4: 6.15 and 6.25; bench_parakeet --compare blocks)
BLOCK, SCAN_BLOCK = 16, 8


def _bucket(n: int, step: int) -> int:
    return -(-n // step) * step


class CudaGreedy:
    """(f (B, T, J) joint-projected frames on the GPU, lengths (B,)) -> per item its
    (label, frame, skip) tokens, as greedy() returns them."""

    def __init__(
        self,
        model: ParakeetTransducer,
        block: int | None = None,
        frame_bucket: int = 32,
        compile_step: bool | None = None,
        scan: bool | None = None,
        dtype: torch.dtype = torch.float32,
        fused_step: bool | None = None,
    ) -> None:
        """block: steps per replay (default BLOCK, SCAN_BLOCK with the scan).
        compile_step (default: on a GPU): torch.compile the step, fusing its small ops.
        scan: each step first skips the blanks before the next token in one pass over the
        frames (skip_blanks), so a step emits a token: fewer, larger steps; None: for batches
        up to SCAN_BATCH (on an H200, batch 1: 6.9 ms against 10.1 ms; batch 128: slower).
        dtype: of the matrix products (the LSTM state stays float32).
        fused_step (default: on a GPU with Triton): the step's small ops as Triton kernels
        between its products (speechrt.runtime.transducer_step); then only skip_blanks is
        compiled. On the CPU only under Triton's interpreter (TRITON_INTERPRET=1)."""
        self.scan, self.dtype = scan, dtype
        d = model.dims
        self.d, self.block, self.frame_bucket = d, block, frame_bucket
        self.device = next(model.parameters()).device
        if compile_step is None:
            compile_step = self.device.type == "cuda"
        if fused_step is None:
            fused_step = self.device.type == "cuda" and transducer_step.supported(self.device)
        if fused_step and not transducer_step.supported(self.device):
            raise ValueError("fused_step needs Triton and a GPU (or TRITON_INTERPRET=1)")
        self.fused = fused_step
        if compile_step:  # one compiled step per (batch, frames) bucket, all of them kept
            allow_recompiles()
        self.skip_fn = self.skip_blanks
        if fused_step:  # the Triton step; only its scan's skip_blanks compiled
            self.step_fn = self.fused_step
            if compile_step:
                self.skip_fn = torch.compile(self.skip_blanks, dynamic=False)
        else:
            self.step_fn = torch.compile(self.step, dynamic=False) if compile_step else self.step
        dev, f32 = self.device, dtype  # the weights in the products' dtype
        lstm = model.predictor.lstm
        # per layer: W = [W_ih | W_hh] (4H, in + H), b = b_ih + b_hh
        self.w = [
            torch.cat((getattr(lstm, f"weight_ih_l{i}"), getattr(lstm, f"weight_hh_l{i}")), 1)
            .detach()
            .to(dev, f32)
            for i in range(d.pred_layers)
        ]
        self.b = [
            (getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}")).detach().to(dev, f32)
            for i in range(d.pred_layers)
        ]
        self.embed = model.predictor.embed.weight.detach().to(dev, f32)
        j = model.joint
        self.pred_w, self.pred_b = (
            j.pred.weight.detach().to(dev, f32),
            j.pred.bias.detach().to(dev, f32),
        )
        # the joint's output rows padded with zeros to a multiple of 64: cuBLAS has no fast
        # kernel for 1,030 rows (tokens + blank + 5 durations), decide() reads the real ones
        pad = -j.out.out_features % 64
        self.out_w = F.pad(j.out.weight.detach(), (0, 0, 0, pad)).to(dev, f32)
        self.out_b = F.pad(j.out.bias.detach(), (0, pad)).to(dev, f32)
        self.durations = torch.tensor(d.durations or (0,), device=self.device)
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph | None, dict]] = {}

    # -- the step, on static tensors ----------------------------------------------------------

    def predict(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (B,), h, c (L, B, H) -> g (B, J) through the joint's projection, h, c"""
        x = self.embed[tokens].float()
        hs, cs = [], []
        for i in range(self.d.pred_layers):
            xh = torch.cat((x, h[i]), 1).to(self.dtype)
            gates = F.linear(xh, self.w[i], self.b[i]).float()  # (B, 4H)
            ig, fg, gg, og = gates.chunk(4, 1)
            ci = torch.sigmoid(fg) * c[i] + torch.sigmoid(ig) * torch.tanh(gg)
            x = torch.sigmoid(og) * torch.tanh(ci)
            hs.append(x)
            cs.append(ci)
        g = F.linear(x.to(self.dtype), self.pred_w, self.pred_b).float()
        return g, torch.stack(hs), torch.stack(cs)

    def decide(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """logits (..., classes [+ durations]) -> label, blank, skip (...)"""
        d = self.d
        label = logits[..., : d.vocab_size + 1].argmax(-1)
        blank = label == d.vocab_size
        if d.durations:
            skip = self.durations[logits[..., d.vocab_size + 1 : d.n_joint_out].argmax(-1)]
            return label, blank, torch.where(blank & (skip == 0), 1, skip)
        return label, blank, blank.long()

    def skip_blanks(self, s: dict[str, Tensor]) -> None:
        """Move each item's t along its chain of blanks to the next frame where its current g
        gives a token (or past its end) at once: the joint on every frame with g (one GEMM),
        then pointer jumping over next[t] = t + skip(t) for a blank, t for a token."""
        B, T, _ = s["f"].shape
        hidden = F.relu(s["f"] + s["g"][:, None]).to(self.dtype)
        logits = F.linear(hidden, self.out_w, self.out_b)  # (B, T, classes [+ durations])
        _, blank, skip = self.decide(logits)
        frames = torch.arange(T + 1, device=self.device)
        nxt = torch.where(blank, frames[None, :T] + skip, frames[None, :T]).clamp(max=T)
        nxt = torch.where(frames[None, :T] < s["lengths"][:, None], nxt, T)  # past the end
        nxt = torch.cat((nxt, torch.full((B, 1), T, device=self.device)), 1)  # (B, T + 1)
        for _ in range(max(1, T.bit_length())):  # 2**k steps along every chain
            nxt = nxt.gather(1, nxt)
        s["t"].copy_(nxt.gather(1, s["t"].clamp(max=T)[:, None])[:, 0])

    def step(self, s: dict[str, Tensor], scan: bool) -> None:
        d = self.d
        if scan:
            self.skip_blanks(s)
        B, T, _ = s["f"].shape
        rows = torch.arange(B, device=self.device)
        t = s["t"]
        active = t < s["lengths"]
        fe = s["f"][rows, t.clamp(max=T - 1)]  # (B, J)
        hidden = F.relu(fe + s["g"]).to(self.dtype)
        label, blank, skip = self.decide(F.linear(hidden, self.out_w, self.out_b))
        token = active & ~blank
        n = s["count"].clamp(max=s["labels"].shape[1] - 1)
        for name, value in (("labels", label), ("frames", t), ("skips", skip)):
            old = s[name][rows, n]
            s[name][rows, n] = torch.where(token, value, old)
        s["count"] += token
        same = s["last_frame"] == t
        s["on_frame"].copy_(
            torch.where(token, torch.where(same, s["on_frame"] + 1, 1), s["on_frame"])
        )
        s["last_frame"].copy_(torch.where(token, t, s["last_frame"]))
        g, h, c = self.predict(torch.where(token, label, d.vocab_size), s["h"], s["c"])
        s["g"].copy_(torch.where(token[:, None], g, s["g"]))
        s["h"].copy_(torch.where(token[None, :, None], h, s["h"]))
        s["c"].copy_(torch.where(token[None, :, None], c, s["c"]))
        force = token & (skip == 0) & (s["on_frame"] >= d.max_symbols)
        t.add_(skip * active + force)
        s["running"].copy_((t < s["lengths"]).any())

    def fused_step(self, s: dict[str, Tensor], scan: bool) -> None:
        """step() as 3 + pred_layers Triton kernels between the same four products. g is
        selected at the start of the next step (s["token"], s["g_new"]), h and c in the cells."""
        ts = transducer_step
        if scan:  # skip_blanks reads g
            ts.joint_input(s, select=True, gather=False)
            self.skip_fn(s)
            ts.joint_input(s, select=False, gather=True)
        else:
            ts.joint_input(s, select=True, gather=True)
        logits = F.linear(s["hidden"], self.out_w, self.out_b)
        durations = self.durations if self.d.durations else None
        ts.decide(logits, s, self.embed, durations, self.d.max_symbols)
        for i in range(self.d.pred_layers):
            ts.cell(F.linear(s["xh"][i], self.w[i], self.b[i]), s, i)
        # into a buffer: the next step (in the next graph replay, after a block) reads it
        torch.addmm(self.pred_b, s["x_out"], self.pred_w.t(), out=s["g_new"])

    # -- buffers, capture, replay ---------------------------------------------------------------

    def buffers(self, B: int, T: int) -> dict[str, Tensor]:
        d, dev = self.d, self.device
        state = torch.zeros(d.pred_layers, B, d.pred_hidden, device=dev)
        M = T * max(d.max_symbols, 1) + 1  # the most tokens an item can emit
        long = torch.long
        s = {
            "f": torch.zeros(B, T, d.joint_hidden, device=dev),
            "lengths": torch.zeros(B, device=dev, dtype=long),
            "t": torch.zeros(B, device=dev, dtype=long),
            "g": torch.zeros(B, d.joint_hidden, device=dev),
            "h": state,
            "c": state.clone(),
            "last_frame": torch.full((B,), -1, device=dev, dtype=long),
            "on_frame": torch.zeros(B, device=dev, dtype=long),
            "count": torch.zeros(B, device=dev, dtype=long),
            "labels": torch.zeros(B, M, device=dev, dtype=long),
            "frames": torch.zeros(B, M, device=dev, dtype=long),
            "skips": torch.zeros(B, M, device=dev, dtype=long),
            "running": torch.zeros((), device=dev, dtype=torch.int32),
            "g0": torch.zeros(B, d.joint_hidden, device=dev),
            "h0": state.clone(),
            "c0": state.clone(),
        }
        if self.fused:  # the kernels' rows: token emitted (B,), the products' inputs, g'
            H2, dt = 2 * d.pred_hidden, self.dtype
            s["token"] = torch.zeros(B, device=dev, dtype=torch.int8)
            s["hidden"] = torch.zeros(B, d.joint_hidden, device=dev, dtype=dt)
            s["xh"] = torch.zeros(d.pred_layers, B, H2, device=dev, dtype=dt)
            s["x_out"] = torch.zeros(B, d.pred_hidden, device=dev, dtype=dt)
            s["g_new"] = torch.zeros(B, d.joint_hidden, device=dev, dtype=dt)
        return s

    def reset(self, s: dict[str, Tensor]) -> None:
        s["t"].zero_()
        s["g"].copy_(s["g0"])
        s["h"].copy_(s["h0"])
        s["c"].copy_(s["c0"])
        s["last_frame"].fill_(-1)
        s["on_frame"].zero_()
        s["count"].zero_()
        if self.fused:
            s["token"].zero_()
        s["running"].copy_((s["t"] < s["lengths"]).any())

    def block_fn(self, s: dict[str, Tensor], scan: bool) -> None:
        n = self.block or (SCAN_BLOCK if scan else BLOCK)
        for _ in range(n):
            self.step_fn(s, scan)

    def capture(
        self, B: int, T: int, scan: bool
    ) -> tuple[torch.cuda.CUDAGraph | None, dict[str, Tensor]]:
        """The buffers of a (batch, frames) bucket and its block of steps as a CUDA graph
        (None off the GPU: the block then runs as it is, e.g. in the CPU tests)."""
        s = self.buffers(B, T)
        blank = torch.full((B,), self.d.vocab_size, device=self.device)
        g0, h0, c0 = self.predict(blank, s["h0"], s["c0"])  # the start symbol's prediction
        s["g0"].copy_(g0)
        s["h0"].copy_(h0)
        s["c0"].copy_(c0)
        if self.device.type != "cuda":
            return None, s
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # compile and warm up outside the capture
            for _ in range(2):
                self.step_fn(s, scan)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.block_fn(s, scan)
        return graph, s

    @torch.inference_mode()
    def __call__(self, f: Tensor, lengths: Tensor) -> list[list[tuple[int, int, int]]]:
        B, T, _ = f.shape
        scan = B <= SCAN_BATCH if self.scan is None else self.scan
        key = (1 << (B - 1).bit_length(), _bucket(T, self.frame_bucket), scan)
        if key not in self.graphs:
            self.graphs[key] = self.capture(*key)
        graph, s = self.graphs[key]
        s["f"].zero_()
        s["f"][:B, :T].copy_(f, non_blocking=True)
        s["lengths"].zero_()
        s["lengths"][:B].copy_(lengths, non_blocking=True)
        self.reset(s)
        while bool(s["running"]):  # one read per block of steps
            if graph is None:
                self.block_fn(s, scan)
            else:
                graph.replay()
        count = s["count"][:B].tolist()
        got = [s[k][:B].cpu() for k in ("labels", "frames", "skips")]
        return [list(zip(*(x[i, : count[i]].tolist() for x in got), strict=True)) for i in range(B)]
