"""The Triton kernels of relational attention (flash-style forward and backward), launched by
triton.py. Imported by its first launch: importing triton costs every process that imports it
about 0.3 s of CPU, which a process that never launches a kernel does not pay.

Shapes (B batch, H query heads, Hkv kv heads dividing H, R relations, N queries, M keys):

    q (B, H, N, dk)   k (B, Hkv, M, dk)   v (B, Hkv, M, hd)   qr (B, R, N, dr)   kr (B, R, M, dr)
    out (B, H, N, hd + R) = [sym | rel]

Math, per batch element; query head h reads kv head h // (H / Hkv) (see naive.py):

    s_hij = scale <q_hi, k_j>              -inf where masked (causal, top-left, or attn_mask)
    p_hij = exp(s_hij - lse_hi)            lse_hi = logsumexp_j s_hij; a row with no key: p = 0
    r_lij = act(rel_scale <qr_li, kr_lj>)  relations: unmasked, shared by all heads
    sym_hi = sum_j p_hij v_j               rel_hil = sum_j p_hij r_lij

Forward (`forward`): one program per (query tile, batch element) holds every head. Per key
tile it computes the scores of all heads (a batched dot, heads as the batch), updates the
online softmax, then computes each relation tile r_l once and contracts it with the weights of
every head. Besides the output only lse (B, H, N) is stored: no N x M tensor reaches global
memory. With rel_activation="softmax" (over all keys, unmasked) a first sweep over the key tiles
gives the relation row logsumexp rlse (B, R, N), and r_lij = exp(raw_lij - rlse_li).

Backward recomputes p and r from lse (and rlse):

    dp_hij = <dsym_hi, v_j> + sum_l drel_hil r_lij        ds = p (dp - delta_hi)
    delta_hi = <dsym_hi, sym_hi> + <drel_hi, rel_hi>
    dq = scale ds k        dk = scale ds^T q        dv = p^T dsym
    dr_lij = sum_h p_hij drel_hil -> draw = act'(raw) dr    (softmax: r (dr - sum_h drel rel))
    dqr = rel_scale draw kr                dkr = rel_scale draw^T qr

`backward_queries` (a program per query tile) sums dq and dqr over key tiles;
`backward_keys` (a program per key tile) sums dk, dv and dkr over query tiles, per query head
(the wrapper adds up the heads that share a kv head). With the softmax activation the relation
gradient does not vanish where p does (above the causal diagonal), so both sweep every tile.

Dots in IEEE fp32 for float32 (no TF32), in the input dtype for float16 and bfloat16, with fp32
accumulation. Tiles are BLOCK_M x BLOCK_N; widths and head / relation counts are padded to powers
of two (widths to at least 16, the smallest dot). Under the Triton interpreter (TRITON_INTERPRET=1
set before triton is first imported) `triton.jit` gives interpreted kernels, which run on CPU.
"""

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------
# Tile helpers. All tensors are contiguous; offsets are int64 (the batch index is).


@triton.jit
def _head_tile(b, heads, n_heads, head_ok, rows, length,
               WIDTH: tl.constexpr, WIDTH_P: tl.constexpr):  # fmt: skip
    """Offsets and bounds of the (heads, rows, WIDTH_P) tile of a (B, n_heads, length, WIDTH)
    tensor; `heads` (H_P,) are head indices, `rows` (BLOCK,) positions."""
    cols = tl.arange(0, WIDTH_P)
    offs = ((b * n_heads + heads[:, None, None]) * length + rows[None, :, None]) * WIDTH
    ok = head_ok[:, None, None] & (rows < length)[None, :, None] & (cols < WIDTH)[None, None, :]
    return offs + cols[None, None, :], ok


@triton.jit
def _head_rows(b, heads, n_heads, head_ok, rows, length):
    """Offsets and bounds of the (heads, rows) tile of a (B, n_heads, length) tensor."""
    offs = (b * n_heads + heads[:, None]) * length + rows[None, :]
    return offs, head_ok[:, None] & (rows < length)[None, :]


@triton.jit
def _row_tile(index, rows, length, WIDTH: tl.constexpr, WIDTH_P: tl.constexpr):
    """Offsets and bounds of the (rows, WIDTH_P) tile of matrix `index` of a (.., length,
    WIDTH) tensor."""
    cols = tl.arange(0, WIDTH_P)
    offs = (index * length + rows[:, None]) * WIDTH + cols[None, :]
    return offs, (rows < length)[:, None] & (cols < WIDTH)[None, :]


@triton.jit
def _scores(q, k, b, heads, head_ok, rows, cols, N, M, scale, MASK, mask_b, mask_h, mask_n, mask_m,
            CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    """(H_P, BLOCK, BLOCK) scores scale q k^T, -inf where query i may not attend key j."""
    s = tl.dot(q, tl.permute(k, (0, 2, 1)), input_precision=DOT) * scale
    ok = (cols < M)[None, None, :]
    if CAUSAL:
        ok = ok & (cols[None, :] <= rows[:, None])[None, :, :]
    if HAS_MASK:
        offs = b * mask_b + heads[:, None, None] * mask_h + rows[None, :, None] * mask_n
        inside = head_ok[:, None, None] & (rows < N)[None, :, None] & (cols < M)[None, None, :]
        allowed = tl.load(MASK + offs + cols[None, None, :] * mask_m, mask=inside, other=0)
        ok = ok & (allowed != 0)
    return tl.where(ok, s, float("-inf"))


@triton.jit
def _tanh(x):
    x = tl.minimum(tl.maximum(x, -15.0), 15.0)  # tanh(15) is 1 in float32; exp stays finite
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _activate(x, ACT: tl.constexpr):
    """The elementwise rel_activation (gelu: its tanh form, as activations.py)."""
    y = x
    if ACT == "relu":
        y = tl.maximum(x, 0.0)
    elif ACT == "sigmoid":
        y = tl.sigmoid(x)
    elif ACT == "tanh":
        y = _tanh(x)
    elif ACT == "gelu":
        y = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif ACT == "silu":
        y = x * tl.sigmoid(x)
    return y


@triton.jit
def _activation_slope(x, y, ACT: tl.constexpr):
    """act'(x) given y = act(x), for the elementwise activations other than identity."""
    g = y
    if ACT == "relu":
        g = tl.where(x > 0.0, 1.0, 0.0)
    elif ACT == "sigmoid":
        g = y * (1.0 - y)
    elif ACT == "tanh":
        g = 1.0 - y * y
    elif ACT == "gelu":
        t = _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
        inner = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
        g = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * inner
    elif ACT == "silu":
        s = tl.sigmoid(x)
        g = s * (1.0 + x * (1.0 - s))
    return g


@triton.jit
def _raw_relation(QR, KR, index, rows, cols, N, M, rel_scale,
                  D_R: tl.constexpr, D_RP: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    """qr_l (BLOCK, D_RP), kr_l (BLOCK, D_RP) and raw = rel_scale qr_l kr_l^T (BLOCK, BLOCK)
    of relation matrix `index` = b R + l."""
    q_offs, q_ok = _row_tile(index, rows, N, D_R, D_RP)
    k_offs, k_ok = _row_tile(index, cols, M, D_R, D_RP)
    qr = tl.load(QR + q_offs, mask=q_ok, other=0.0)
    kr = tl.load(KR + k_offs, mask=k_ok, other=0.0)
    return qr, kr, tl.dot(qr, tl.trans(kr), input_precision=DOT) * rel_scale


@triton.jit
def _relation(raw, cols, M, rlse_l, ACT: tl.constexpr):
    """r = act(raw) of a (BLOCK, BLOCK) tile; rlse_l (BLOCK,): the row logsumexp of the raw
    relations over every key (used by the softmax activation only)."""
    if ACT == "softmax":
        r = tl.where((cols < M)[None, :], tl.exp(raw - rlse_l[:, None]), 0.0)
    else:
        r = _activate(raw, ACT)
    return r


@triton.jit
def _relation_grad(p, drel_l, raw, r, row_term_l, rel_scale, ACT: tl.constexpr):
    """rel_scale * dloss/draw (BLOCK, BLOCK) of relation l, from dr_ij = sum_h p_hij drel_hil;
    p (H_P, BLOCK, BLOCK), drel_l (H_P, BLOCK), row_term_l (BLOCK,) = sum_h drel_hil rel_hil."""
    dr = tl.sum(p * drel_l[:, :, None], axis=0)
    if ACT == "softmax":
        dr = r * (dr - row_term_l[:, None])
    elif ACT != "identity":
        dr = dr * _activation_slope(raw, r, ACT)
    return dr * rel_scale


@triton.jit
def _relation_stats(RLSE, ROW_TERM, index, rows, N, ACT: tl.constexpr):
    """(rlse_l, row_term_l) of relation matrix `index` for the softmax activation, else zeros."""
    rlse_l = tl.zeros(rows.shape, tl.float32)
    row_term_l = tl.zeros(rows.shape, tl.float32)
    if ACT == "softmax":
        rlse_l = tl.load(RLSE + index * N + rows, mask=rows < N, other=0.0)
        row_term_l = tl.load(ROW_TERM + index * N + rows, mask=rows < N, other=0.0)
    return rlse_l, row_term_l


# ---------------------------------------------------------------------------------------------
# Kernels. Grid: (tiles along N or M, B).


@triton.jit
def forward(
    Q, K, V, QR, KR, MASK, O_SYM, O_REL, LSE, RLSE,
    N, M, H, HKV, scale, rel_scale, mask_b, mask_h, mask_n, mask_m,
    R: tl.constexpr, R_P: tl.constexpr, H_P: tl.constexpr,
    D_K: tl.constexpr, D_KP: tl.constexpr, D_V: tl.constexpr, D_VP: tl.constexpr,
    D_R: tl.constexpr, D_RP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """O_SYM (B, H, N, hd) and O_REL (B, H, N, R) in q's dtype, LSE (B, H, N) and, with the
    softmax activation, RLSE (B, R, N), float32: one query tile over the key tiles."""
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    heads = tl.arange(0, H_P)
    head_ok = heads < H
    kv_heads = heads // (H // HKV)
    rel_ids = tl.arange(0, R_P)
    q_offs, q_ok = _head_tile(b, heads, H, head_ok, rows, N, D_K, D_KP)
    q = tl.load(Q + q_offs, mask=q_ok, other=0.0)

    # softmax activation: relation row logsumexp over every key, kept as an (R_P, BLOCK_M) tile
    rlse = tl.zeros((R_P, BLOCK_M), tl.float32)
    if ACT == "softmax":
        for l in tl.static_range(R):
            run_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            run_sum = tl.zeros((BLOCK_M,), tl.float32)
            for start_n in range(0, M, BLOCK_N):
                cols = start_n + tl.arange(0, BLOCK_N)
                qr, kr, raw = _raw_relation(QR, KR, b * R + l, rows, cols, N, M, rel_scale,
                                            D_R, D_RP, DOT)  # fmt: skip
                raw = tl.where((cols < M)[None, :], raw, float("-inf"))
                new_max = tl.maximum(run_max, tl.max(raw, 1))
                run_sum = run_sum * tl.exp(run_max - new_max)
                run_sum += tl.sum(tl.exp(raw - new_max[:, None]), 1)
                run_max = new_max
            lse_l = run_max + tl.log(run_sum)
            tl.store(RLSE + (b * R + l) * N + rows, lse_l, mask=rows < N)
            rlse = tl.where((rel_ids == l)[:, None], lse_l[None, :], rlse)

    m_i = tl.full((H_P, BLOCK_M), float("-inf"), tl.float32)  # running max
    l_i = tl.zeros((H_P, BLOCK_M), tl.float32)  # running sum of exp(s - m_i)
    acc_sym = tl.zeros((H_P, BLOCK_M, D_VP), tl.float32)
    acc_rel = tl.zeros((H_P, BLOCK_M, R_P), tl.float32)
    end = tl.minimum(M, start_m + BLOCK_M) if CAUSAL else M
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k_offs, k_ok = _head_tile(b, kv_heads, HKV, head_ok, cols, M, D_K, D_KP)
        v_offs, v_ok = _head_tile(b, kv_heads, HKV, head_ok, cols, M, D_V, D_VP)
        k = tl.load(K + k_offs, mask=k_ok, other=0.0)
        v = tl.load(V + v_offs, mask=v_ok, other=0.0)
        s = _scores(q, k, b, heads, head_ok, rows, cols, N, M, scale,
                    MASK, mask_b, mask_h, mask_n, mask_m, CAUSAL, HAS_MASK, DOT)  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key so far
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, :, None])
        l_i = l_i * alpha + tl.sum(p, 2)
        acc_sym = acc_sym * alpha[:, :, None]
        acc_sym += tl.dot(p.to(v.dtype), v, input_precision=DOT)
        acc_rel = acc_rel * alpha[:, :, None]
        for l in tl.static_range(R):  # the relation tile once, for every head
            rlse_l = tl.sum(tl.where((rel_ids == l)[:, None], rlse, 0.0), 0)
            qr, kr, raw = _raw_relation(QR, KR, b * R + l, rows, cols, N, M, rel_scale,
                                        D_R, D_RP, DOT)  # fmt: skip
            r = _relation(raw, cols, M, rlse_l, ACT)
            rel_l = tl.sum(p * r[None, :, :], 2)  # (H_P, BLOCK_M)
            acc_rel = tl.where((rel_ids == l)[None, None, :], acc_rel + rel_l[:, :, None], acc_rel)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)[:, :, None]  # rows with no key give zeros
    o_offs, o_ok = _head_tile(b, heads, H, head_ok, rows, N, D_V, D_VP)
    tl.store(O_SYM + o_offs, acc_sym / l_safe, mask=o_ok)
    o_offs, o_ok = _head_tile(b, heads, H, head_ok, rows, N, R, R_P)
    tl.store(O_REL + o_offs, acc_rel / l_safe, mask=o_ok)
    row_offs, row_ok = _head_rows(b, heads, H, head_ok, rows, N)
    # +inf for a row with no key: exp(s - lse) = 0 in backward
    lse = tl.where(l_i == 0.0, float("inf"), m_i + tl.log(tl.where(l_i == 0.0, 1.0, l_i)))
    tl.store(LSE + row_offs, lse, mask=row_ok)


@triton.jit
def backward_queries(
    Q, K, V, QR, KR, MASK, DO_SYM, DO_REL, LSE, DELTA, RLSE, ROW_TERM, DQ, DQR,
    N, M, H, HKV, scale, rel_scale, mask_b, mask_h, mask_n, mask_m,
    R: tl.constexpr, R_P: tl.constexpr, H_P: tl.constexpr,
    D_K: tl.constexpr, D_KP: tl.constexpr, D_V: tl.constexpr, D_VP: tl.constexpr,
    D_R: tl.constexpr, D_RP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dq (B, H, N, dk) and dqr (B, R, N, dr), float32: one query tile over the key tiles."""
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    heads = tl.arange(0, H_P)
    head_ok = heads < H
    kv_heads = heads // (H // HKV)
    rel_ids = tl.arange(0, R_P)
    q_offs, q_ok = _head_tile(b, heads, H, head_ok, rows, N, D_K, D_KP)
    q = tl.load(Q + q_offs, mask=q_ok, other=0.0)
    do_offs, do_ok = _head_tile(b, heads, H, head_ok, rows, N, D_V, D_VP)
    do_sym = tl.load(DO_SYM + do_offs, mask=do_ok, other=0.0)
    row_offs, row_ok = _head_rows(b, heads, H, head_ok, rows, N)
    lse = tl.load(LSE + row_offs, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + row_offs, mask=row_ok, other=0.0)

    dq = tl.zeros((H_P, BLOCK_M, D_KP), tl.float32)
    dqr = tl.zeros((R_P, BLOCK_M, D_RP), tl.float32)
    end = tl.minimum(M, start_m + BLOCK_M) if CAUSAL and ACT != "softmax" else M
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k_offs, k_ok = _head_tile(b, kv_heads, HKV, head_ok, cols, M, D_K, D_KP)
        v_offs, v_ok = _head_tile(b, kv_heads, HKV, head_ok, cols, M, D_V, D_VP)
        k = tl.load(K + k_offs, mask=k_ok, other=0.0)
        v = tl.load(V + v_offs, mask=v_ok, other=0.0)
        s = _scores(q, k, b, heads, head_ok, rows, cols, N, M, scale,
                    MASK, mask_b, mask_h, mask_n, mask_m, CAUSAL, HAS_MASK, DOT)  # fmt: skip
        p = tl.exp(s - lse[:, :, None])
        dp = tl.dot(do_sym, tl.permute(v, (0, 2, 1)), input_precision=DOT)
        for l in tl.static_range(R):
            rlse_l, row_term_l = _relation_stats(RLSE, ROW_TERM, b * R + l, rows, N, ACT)
            qr, kr, raw = _raw_relation(QR, KR, b * R + l, rows, cols, N, M, rel_scale,
                                        D_R, D_RP, DOT)  # fmt: skip
            r = _relation(raw, cols, M, rlse_l, ACT)
            drel_l = tl.load(DO_REL + row_offs * R + l, mask=row_ok, other=0.0)
            dp += drel_l[:, :, None] * r[None, :, :]
            draw = _relation_grad(p, drel_l, raw, r, row_term_l, rel_scale, ACT)
            dqr_l = tl.dot(draw.to(kr.dtype), kr, input_precision=DOT)
            dqr = tl.where((rel_ids == l)[:, None, None], dqr + dqr_l[None, :, :], dqr)
        ds = p * (dp - delta[:, :, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT)

    tl.store(DQ + q_offs, dq * scale, mask=q_ok)
    dqr_offs, dqr_ok = _head_tile(b, rel_ids, R, rel_ids < R, rows, N, D_R, D_RP)
    tl.store(DQR + dqr_offs, dqr, mask=dqr_ok)


@triton.jit
def backward_keys(
    Q, K, V, QR, KR, MASK, DO_SYM, DO_REL, LSE, DELTA, RLSE, ROW_TERM, DK, DV, DKR,
    N, M, H, HKV, scale, rel_scale, mask_b, mask_h, mask_n, mask_m,
    R: tl.constexpr, R_P: tl.constexpr, H_P: tl.constexpr,
    D_K: tl.constexpr, D_KP: tl.constexpr, D_V: tl.constexpr, D_VP: tl.constexpr,
    D_R: tl.constexpr, D_RP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dk, dv per query head (B, H, M, .) and dkr (B, R, M, dr), float32: one key tile over the
    query tiles."""
    start_n = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1).to(tl.int64)
    cols = start_n + tl.arange(0, BLOCK_N)
    heads = tl.arange(0, H_P)
    head_ok = heads < H
    kv_heads = heads // (H // HKV)
    rel_ids = tl.arange(0, R_P)
    k_offs, k_ok = _head_tile(b, kv_heads, HKV, head_ok, cols, M, D_K, D_KP)
    v_offs, v_ok = _head_tile(b, kv_heads, HKV, head_ok, cols, M, D_V, D_VP)
    k = tl.load(K + k_offs, mask=k_ok, other=0.0)
    v = tl.load(V + v_offs, mask=v_ok, other=0.0)

    dk = tl.zeros((H_P, BLOCK_N, D_KP), tl.float32)
    dv = tl.zeros((H_P, BLOCK_N, D_VP), tl.float32)
    dkr = tl.zeros((R_P, BLOCK_N, D_RP), tl.float32)
    begin = (start_n // BLOCK_M) * BLOCK_M if CAUSAL and ACT != "softmax" else 0
    for start_m in range(begin, N, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q_offs, q_ok = _head_tile(b, heads, H, head_ok, rows, N, D_K, D_KP)
        q = tl.load(Q + q_offs, mask=q_ok, other=0.0)
        do_offs, do_ok = _head_tile(b, heads, H, head_ok, rows, N, D_V, D_VP)
        do_sym = tl.load(DO_SYM + do_offs, mask=do_ok, other=0.0)
        row_offs, row_ok = _head_rows(b, heads, H, head_ok, rows, N)
        lse = tl.load(LSE + row_offs, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + row_offs, mask=row_ok, other=0.0)
        s = _scores(q, k, b, heads, head_ok, rows, cols, N, M, scale,
                    MASK, mask_b, mask_h, mask_n, mask_m, CAUSAL, HAS_MASK, DOT)  # fmt: skip
        p = tl.exp(s - lse[:, :, None])
        dp = tl.dot(do_sym, tl.permute(v, (0, 2, 1)), input_precision=DOT)
        for l in tl.static_range(R):
            rlse_l, row_term_l = _relation_stats(RLSE, ROW_TERM, b * R + l, rows, N, ACT)
            qr, kr, raw = _raw_relation(QR, KR, b * R + l, rows, cols, N, M, rel_scale,
                                        D_R, D_RP, DOT)  # fmt: skip
            r = _relation(raw, cols, M, rlse_l, ACT)
            drel_l = tl.load(DO_REL + row_offs * R + l, mask=row_ok, other=0.0)
            dp += drel_l[:, :, None] * r[None, :, :]
            draw = _relation_grad(p, drel_l, raw, r, row_term_l, rel_scale, ACT)
            dkr_l = tl.dot(tl.trans(draw).to(qr.dtype), qr, input_precision=DOT)
            dkr = tl.where((rel_ids == l)[:, None, None], dkr + dkr_l[None, :, :], dkr)
        ds = p * (dp - delta[:, :, None])
        dv += tl.dot(tl.permute(p, (0, 2, 1)).to(do_sym.dtype), do_sym, input_precision=DOT)
        dk += tl.dot(tl.permute(ds, (0, 2, 1)).to(q.dtype), q, input_precision=DOT)

    dk_offs, dk_ok = _head_tile(b, heads, H, head_ok, cols, M, D_K, D_KP)
    tl.store(DK + dk_offs, dk * scale, mask=dk_ok)
    dv_offs, dv_ok = _head_tile(b, heads, H, head_ok, cols, M, D_V, D_VP)
    tl.store(DV + dv_offs, dv, mask=dv_ok)
    dkr_offs, dkr_ok = _head_tile(b, rel_ids, R, rel_ids < R, cols, M, D_R, D_RP)
    tl.store(DKR + dkr_offs, dkr, mask=dkr_ok)
