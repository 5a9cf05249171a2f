"""ELMo's biLM body (Peters et al. 2018, sec. 3): a character CNN token encoder and L-layer LSTMs
per direction.

Token representation x_k^LM (Jozefowicz et al. 2016, "char CNN"; Kim et al. 2016): each word's
characters (tokenizer/chars.py) are embedded, convolved by filters of several widths, max-pooled
over the characters and passed through ReLU, then highway layers (Srivastava et al. 2015) and a
linear projection to d_model. Highway as bilm-tf writes it (its names, W_carry and W_transform):

    y = g * relu(W_T x + b_T) + (1 - g) * x,     g = sigmoid(W_C x + b_C)

Contextual layers h_k,j: per direction, n_layers LSTMs with a projection (LSTMP, Sak et al. 2014),
the memory cell clipped to +-cell_clip and the projected output to +-proj_clip, and a residual
connection around every layer but the first. One step of one layer, gates in the order
(input i, forget f, cell input g, output o) of PyTorch and AllenNLP:

    c_t = clip(sigmoid(i) * tanh(g) + sigmoid(f) * c_{t-1});   h_t = clip(P (sigmoid(o) * tanh(c_t)))

Two ways to run a layer, chosen by ProjectedLSTM.fused (`auto` | `on` | `off`, set through
ELMo.set_fused_lstm): step by step (the reference: T small matmuls, the clips applied between
steps), or fused: one cuDNN LSTMP call (torch.lstm with a projection; a packed batch, so padding and
each row's final state are the reference's). A fused LSTM has no hook between steps, so with a clip
set (ELMo's original sets both to 3) the fused run is checked: every real step's output h_t is in
its result, and every cell c_t follows from the gates, which the outputs give for all steps in one
product, by an elementwise recurrence. Where every h_t and c_t stayed below its clip (by a 1 % margin
that covers the kernels' rounding), neither clip acted and the fused result is the clipped layer's;
otherwise the layer runs again step by step. `auto` fuses on CUDA, `on` on any device, `off` never.

The forward LSTMs read w_1 .. w_n left to right; the backward ones the same words right to left
(each row reversed within its own length, so padding never comes first). They share no state.
"""
from __future__ import annotations

import math
from lmforge.utils.errors import shown
from typing import Optional

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

FUSED_MODES = ("auto", "on", "off")
# a fused run counts as unclipped only where every checked state stays this share below its clip
CHECK_MARGIN = 1e-2


class Highway(nn.Module):
    """One highway layer: y = g * relu(transform(x)) + (1 - g) * x, g = sigmoid(carry(x)) (bilm-tf)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.carry = nn.Linear(d, d)  # the gate (bilm-tf's W_carry, b_carry)
        self.transform = nn.Linear(d, d)  # the non-linear path (W_transform, b_transform)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, d) -> (N, d)
        g = torch.sigmoid(self.carry(x))
        return g * torch.relu(self.transform(x)) + (1 - g) * x

    def reset_parameters(self) -> None:
        """bilm-tf's init: N(0, 1/d) weights; the gate's bias -2, so a new layer mostly passes x through."""
        for linear in (self.carry, self.transform):
            nn.init.normal_(linear.weight, std=math.sqrt(1.0 / linear.in_features))
        nn.init.constant_(self.carry.bias, -2.0)
        nn.init.zeros_(self.transform.bias)


class CharEncoder(nn.Module):
    """x_k^LM: characters -> embeddings -> CNN, max over characters, ReLU -> highways -> projection."""

    def __init__(self, cfg) -> None:
        super().__init__()
        filters = cfg.cnn_filters
        n_filters = sum(n for _, n in filters)
        self.embed = nn.Embedding(cfg.n_characters, cfg.char_embed_dim, padding_idx=0)  # 0: a padding word
        self.convs = nn.ModuleList(nn.Conv1d(cfg.char_embed_dim, n, width) for width, n in filters)
        self.highways = nn.ModuleList(Highway(n_filters) for _ in range(cfg.n_highway))
        self.projection = nn.Linear(n_filters, cfg.d_model)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:  # (N, L) character ids -> (N, d_model)
        x = self.embed(chars).transpose(1, 2)  # (N, e, L): channels first for Conv1d
        # max over the characters, then ReLU (monotone, so the order is the reference's either way)
        x = torch.cat([torch.relu(conv(x).amax(-1)) for conv in self.convs], dim=-1)  # (N, n_filters)
        for highway in self.highways:
            x = highway(x)
        return self.projection(x)

    def reset_parameters(self) -> None:
        """bilm-tf's init: character embeddings U(-1, 1) (the padding row 0), filters U(-0.05, 0.05),
        projection N(0, 1/n_filters); zero biases."""
        nn.init.uniform_(self.embed.weight, -1.0, 1.0)
        with torch.no_grad():
            self.embed.weight[0].zero_()
        for conv in self.convs:
            nn.init.uniform_(conv.weight, -0.05, 0.05)
            nn.init.zeros_(conv.bias)
        for highway in self.highways:
            highway.reset_parameters()
        nn.init.normal_(self.projection.weight, std=math.sqrt(1.0 / self.projection.in_features))
        nn.init.zeros_(self.projection.bias)


class ProjectedLSTM(nn.Module):
    """One direction of one layer: an LSTM whose output is projected (LSTMP) and clipped, as AllenNLP's
    LstmCellWithProjection (its parameter names; no bias on the input and projection matrices)."""

    def __init__(self, d_in: int, d_out: int, d_cell: int, cell_clip: Optional[float],
                 proj_clip: Optional[float]) -> None:
        super().__init__()
        self.d_cell, self.cell_clip, self.proj_clip = d_cell, cell_clip, proj_clip
        self.fused = "auto"  # an execution choice (not saved): see the module docstring
        self.last_run = None  # "fused" or "steps": the path the last call took
        self.input_linearity = nn.Linear(d_in, 4 * d_cell, bias=False)
        self.state_linearity = nn.Linear(d_out, 4 * d_cell)
        self.state_projection = nn.Linear(d_cell, d_out, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, state: Optional[tuple] = None) -> tuple:
        """x (B, T, d_in), mask (B, T) bool, state (h (B, d_out), c (B, d_cell)) or None (zeros) ->
        (outputs (B, T, d_out), zero at padding; final (h, c), each row's after its last real step)."""
        B = x.shape[0]
        if state is None:
            state = (x.new_zeros(B, self.state_projection.out_features), x.new_zeros(B, self.d_cell))
        if self.use_fused(x.device):
            out, final = self._fused(x, mask, state)
            self.last_run = "fused"
            if not self.clipped or self._within_clips(x, mask, state, out):
                return out, final
        self.last_run = "steps"
        return self._steps(x, mask, state)

    def _steps(self, x: torch.Tensor, mask: torch.Tensor, state: tuple) -> tuple:
        """The reference: one step at a time, the clips applied between steps."""
        h, c = state
        T = x.shape[1]
        from_input = self.input_linearity(x)  # (B, T, 4 d_cell): the input's share of every step at once
        outputs = []
        for t in range(T):
            i, f, g, o = (from_input[:, t] + self.state_linearity(h)).chunk(4, dim=-1)
            c_new = torch.sigmoid(i) * torch.tanh(g) + torch.sigmoid(f) * c
            if self.cell_clip:
                c_new = c_new.clamp(-self.cell_clip, self.cell_clip)
            h_new = self.state_projection(torch.sigmoid(o) * torch.tanh(c_new))
            if self.proj_clip:
                h_new = h_new.clamp(-self.proj_clip, self.proj_clip)
            real = mask[:, t, None]  # (B, 1): a padded step leaves the state as it was
            h, c = torch.where(real, h_new, h), torch.where(real, c_new, c)
            outputs.append(h_new * real)
        return torch.stack(outputs, dim=1), (h, c)

    @property
    def clipped(self) -> bool:
        """Whether a clip is set (then a fused run is checked against it)."""
        return bool(self.cell_clip) or bool(self.proj_clip)

    def use_fused(self, device: torch.device) -> bool:
        """Whether this call tries the fused path: 'on', or 'auto' on CUDA."""
        return self.fused == "on" or (self.fused == "auto" and device.type == "cuda")

    @torch.no_grad()
    def _within_clips(self, x: torch.Tensor, mask: torch.Tensor, state: tuple, out: torch.Tensor) -> bool:
        """Whether the unclipped run's h_t and c_t stay inside their clips, with a margin, at every real
        step (then the clipped layer computes the same): h_t is its output; c_t is rebuilt from the
        gates, all steps' at once from the previous outputs, leaving only an elementwise recurrence. In
        fp32 without autocast; the margin (CHECK_MARGIN of the clip) covers the fused kernel's own
        rounding, TF32's included."""
        with torch.autocast(x.device.type, enabled=False):
            x, out, state = x.float(), out.float(), (state[0].float(), state[1].float())
            inside = torch.ones((), dtype=torch.bool, device=x.device)
            if self.proj_clip:
                inside &= (out.abs() < self.proj_clip * (1 - CHECK_MARGIN)).all()
            if self.cell_clip:
                inside &= self._top_cell(x, mask, state, out) < self.cell_clip * (1 - CHECK_MARGIN)
        return bool(inside)  # one read-back a layer: the choice of path

    def _top_cell(self, x: torch.Tensor, mask: torch.Tensor, state: tuple, out: torch.Tensor) -> torch.Tensor:
        """The largest |c_t| over the real steps (the initial state, which no step clips, left out)."""
        previous = torch.cat([state[0][:, None], out[:, :-1]], dim=1)  # h_{t-1} of each real step
        i, f, g, _ = (self.input_linearity(x) + self.state_linearity(previous)).float().chunk(4, dim=-1)
        keep, add = torch.sigmoid(f), torch.sigmoid(i) * torch.tanh(g)
        c = state[1]
        top = torch.zeros_like(c)  # an elementwise running max: one reduction after the loop, not one a step
        for t in range(x.shape[1]):
            real = mask[:, t, None]
            c = torch.where(real, keep[:, t] * c + add[:, t], c)
            top = torch.maximum(top, torch.where(real, c.abs(), 0))
        return top.amax()

    def _fused(self, x: torch.Tensor, mask: torch.Tensor, state: tuple) -> tuple:
        """The layer without clips in one LSTMP call (cuDNN on CUDA) over the packed real steps."""
        lengths = mask.sum(1)
        real = lengths > 0  # a row without words keeps its state, as in the reference
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        order = packed.sorted_indices
        h0, c0 = (s.index_select(0, order)[None].contiguous() for s in state)  # (1, B, d): one layer
        weights = [self.input_linearity.weight, self.state_linearity.weight,
                   self.state_linearity.bias.new_zeros(4 * self.d_cell),  # no input bias (AllenNLP)
                   self.state_linearity.bias, self.state_projection.weight]
        data, h, c = torch.lstm(packed.data, packed.batch_sizes, (h0, c0), weights, True, 1, 0.0,
                                self.training, False)
        out, _ = pad_packed_sequence(PackedSequence(data, packed.batch_sizes, order, packed.unsorted_indices),
                                     batch_first=True, total_length=x.shape[1])
        back = packed.unsorted_indices
        h, c = h[0].index_select(0, back), c[0].index_select(0, back)
        h, c = torch.where(real[:, None], h, state[0]), torch.where(real[:, None], c, state[1])
        return out * mask[..., None], (h, c)

    def reset_parameters(self) -> None:
        """Glorot-uniform matrices (TF's LSTMCell default), zero bias but the forget gate's +1
        (Jozefowicz et al. 2015; TF adds it at run time, here it is part of the bias)."""
        for linear in (self.input_linearity, self.state_linearity, self.state_projection):
            nn.init.xavier_uniform_(linear.weight)
        with torch.no_grad():
            self.state_linearity.bias.zero_()
            self.state_linearity.bias[self.d_cell: 2 * self.d_cell] = 1.0


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's first lengths[b] steps in reverse order, padding left in place: (B, T, ...) -> same.
    Its own inverse, so it also maps the backward LSTM's outputs back to word order."""
    B, T = x.shape[:2]
    t = torch.arange(T, device=x.device)[None]  # (1, T)
    n = lengths.to(x.device)[:, None]  # (B, 1)
    index = torch.where(t < n, n - 1 - t, t)  # (B, T)
    return x.gather(1, index.view(B, T, *[1] * (x.dim() - 2)).expand_as(x))


class BiLSTM(nn.Module):
    """The forward and backward LSTM stacks; dropout on each layer's input, a residual connection
    (the layer's input, dropout applied, added to its output) from the second layer on when
    skip_connections."""

    def __init__(self, cfg) -> None:
        super().__init__()
        d = cfg.d_model

        def stack() -> nn.ModuleList:
            return nn.ModuleList(ProjectedLSTM(d, d, cfg.lstm_dim, cfg.cell_clip, cfg.proj_clip)
                                 for _ in range(cfg.n_layers))

        self.forward_layers, self.backward_layers = stack(), stack()
        self.skip = cfg.skip_connections
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, states: Optional[list] = None) -> tuple:
        """x (B, T, d) token representations, mask (B, T) bool right-padded, states from a previous
        call (or None) -> (forward outputs, backward outputs: per layer (B, T, d) in word order,
        final states: [forward, backward] per layer (h, c))."""
        lengths = mask.sum(1)
        fwd, fwd_final = self._direction(self.forward_layers, x, mask, states[0] if states else None)
        bwd, bwd_final = self._direction(self.backward_layers, reverse_padded(x, lengths), mask,
                                         states[1] if states else None)
        return fwd, [reverse_padded(h, lengths) for h in bwd], [fwd_final, bwd_final]

    def _direction(self, layers: nn.ModuleList, x, mask, states) -> tuple:
        outputs, finals = [], []
        for k, layer in enumerate(layers):
            x = self.dropout(x)
            h, final = layer(x, mask, states[k] if states else None)
            if self.skip and k > 0:  # bilm-tf's Dropout(Residual(cell)): the residual adds the dropped input
                h = h + x * mask[..., None]  # (B, T, d); padding stays zero
            outputs.append(h)
            finals.append(final)
            x = h
        return outputs, finals

    def set_fused(self, mode: str) -> None:
        """Every layer's fused mode: auto | on | off (see the module docstring); ValueError otherwise."""
        if mode not in FUSED_MODES:
            raise ValueError(f"fused_lstm must be one of {', '.join(FUSED_MODES)}, got {shown(mode)}")
        for layer in (*self.forward_layers, *self.backward_layers):
            layer.fused = mode

    def reset_parameters(self) -> None:
        """Every layer's reset_parameters."""
        for layer in (*self.forward_layers, *self.backward_layers):
            layer.reset_parameters()
