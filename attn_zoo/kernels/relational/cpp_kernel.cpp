// Fused relational attention on CPU, float32: tiled forward and backward (see cpp.py for the
// math). Built on first use by torch.utils.cpp_extension with -march=native; BLAS is the sgemm_
// torch links (MKL on x86 builds), else at::mm.
//
// Shapes (any strides, last dim contiguous): q (B,H,N,dk), k (B,Hkv,M,dk), v (B,Hkv,M,dv), qr (B,R,N,dr),
// kr (B,R,M,dr); out (B,H,N,dv+R) = [sum_j p_ij v_j | sum_j p_ij r_ij^l], lse (B,H,N).
// Causal alignment is top-left: query i sees keys j <= i. Every row sees key 0, so no row is empty.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#define CPU_CAPABILITY AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*) __attribute__((weak));

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t VL = Vec::size();
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
bool use_aten_gemm = sgemm_ == nullptr;

// Row-major C (m x n, row stride ldc) = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (!use_aten_gemm) {  // column-major BLAS computes C^T = op(B)^T op(A)^T
    const char ca = tb ? 'T' : 'N', cb = ta ? 'T' : 'N';
    const int im = n, in = m, ik = k, ila = ldb, ilb = lda, ilc = ldc;
    sgemm_(&ca, &cb, &im, &in, &ik, &alpha, b, &ila, a, &ilb, &beta, c, &ilc);
    return;
  }
  auto opt = at::TensorOptions().dtype(at::kFloat);
  auto view = [&](const float* p, int64_t rows, int64_t cols, int64_t ld, bool t) {
    auto x = at::from_blob(const_cast<float*>(p), {t ? cols : rows, t ? rows : cols}, {ld, 1}, opt);
    return t ? x.t() : x;
  };
  auto out = at::from_blob(c, {m, n}, {ldc, 1}, opt);
  auto prod = at::mm(view(a, m, k, lda, ta), view(b, k, n, ldb, tb));
  if (beta == 0.f) {
    out.copy_(prod.mul_(alpha));
  } else {
    out.mul_(beta).add_(prod, alpha);
  }
}

float hsum(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& u, Vec& w) { return u + w; }, x);
}

// Keys a query row sees in tile [j0, j0 + jn): all, or (causal) those with j <= i.
int64_t visible(bool causal, int64_t i, int64_t j0, int64_t jn) {
  return causal ? std::clamp<int64_t>(i + 1 - j0, 0, jn) : jn;
}

// out[h * os + l] += sum_{j < n} P[h * ps + j] Rt[l * rs + j] for HB heads and RB relations.
template <int HB, int RB>
void dots(const float* P, int64_t ps, const float* Rt, int64_t rs, int64_t n, float* out,
          int64_t os) {
  Vec acc[HB][RB];
  for (int h = 0; h < HB; ++h)
    for (int l = 0; l < RB; ++l) acc[h][l] = Vec(0.f);
  for (int64_t j = 0; j < n; j += VL) {
    const int rem = static_cast<int>(std::min<int64_t>(VL, n - j));
    Vec r[RB];
    for (int l = 0; l < RB; ++l) r[l] = Vec::loadu(Rt + l * rs + j, rem);
    for (int h = 0; h < HB; ++h) {
      const Vec p = Vec::loadu(P + h * ps + j, rem);
      for (int l = 0; l < RB; ++l) acc[h][l] = at::vec::fmadd(p, r[l], acc[h][l]);
    }
  }
  for (int h = 0; h < HB; ++h)
    for (int l = 0; l < RB; ++l) out[h * os + l] += hsum(acc[h][l]);
}

// Backward mix of one row, HB heads x RB relations, coefficients c[h * R + l] = drel_i^{h,l}:
//   dP[h * ps + j] += sum_l c[h,l] Rt[l * rs + j]      dR[l * rs + j] += sum_h c[h,l] P[h * ps + j]
template <int HB, int RB>
void mix(const float* P, float* dP, int64_t ps, const float* Rt, float* dR, int64_t rs,
         int64_t n, const float* c, int64_t R) {
  Vec coef[HB][RB];
  for (int h = 0; h < HB; ++h)
    for (int l = 0; l < RB; ++l) coef[h][l] = Vec(c[h * R + l]);
  for (int64_t j = 0; j < n; j += VL) {
    const int rem = static_cast<int>(std::min<int64_t>(VL, n - j));
    Vec r[RB], d[RB];
    for (int l = 0; l < RB; ++l) {
      r[l] = Vec::loadu(Rt + l * rs + j, rem);
      d[l] = Vec::loadu(dR + l * rs + j, rem);
    }
    for (int h = 0; h < HB; ++h) {
      const Vec p = Vec::loadu(P + h * ps + j, rem);
      Vec dp = Vec::loadu(dP + h * ps + j, rem);
      for (int l = 0; l < RB; ++l) {
        dp = at::vec::fmadd(coef[h][l], r[l], dp);
        d[l] = at::vec::fmadd(coef[h][l], p, d[l]);
      }
      dp.store(dP + h * ps + j, rem);
    }
    for (int l = 0; l < RB; ++l) d[l].store(dR + l * rs + j, rem);
  }
}

// The dots and mix instantiations for a block of hb heads x rb relations (1..4 each).
using DotsFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
using MixFn = void (*)(const float*, float*, int64_t, const float*, float*, int64_t, int64_t,
                       const float*, int64_t);
template <int HB>
std::pair<DotsFn, MixFn> kernels_for(int64_t rb) {
  switch (rb) {
    case 1: return {dots<HB, 1>, mix<HB, 1>};
    case 2: return {dots<HB, 2>, mix<HB, 2>};
    case 3: return {dots<HB, 3>, mix<HB, 3>};
    default: return {dots<HB, 4>, mix<HB, 4>};
  }
}
std::pair<DotsFn, MixFn> kernels(int64_t hb, int64_t rb) {
  switch (hb) {
    case 1: return kernels_for<1>(rb);
    case 2: return kernels_for<2>(rb);
    case 3: return kernels_for<3>(rb);
    default: return kernels_for<4>(rb);
  }
}
constexpr int64_t BLOCK_HR = 4;

// Call f(h, l, kernels) for each block of up to BLOCK_HR heads from h x BLOCK_HR relations from
// l, with the kernels instantiated for that block's size.
template <typename F>
void for_each_block(int64_t H, int64_t R, const F& f) {
  for (int64_t h = 0; h < H; h += BLOCK_HR)
    for (int64_t l = 0; l < R; l += BLOCK_HR)
      f(h, l, kernels(std::min(BLOCK_HR, H - h), std::min(BLOCK_HR, R - l)));
}

// Exponentiate a row of scores in place: s[j] = exp(s[j] - m) for j < n, 0 for n <= j < width;
// returns the sum.
float exp_row(float* s, float m, int64_t n, int64_t width) {
  const Vec vm(m);
  Vec sum(0.f);
  int64_t j = 0;
  for (; j + VL <= n; j += VL) {
    const Vec x = (Vec::loadu(s + j) - vm).exp_u20();
    x.store(s + j);
    sum = sum + x;
  }
  float total = hsum(sum);
  for (; j < n; ++j) total += (s[j] = std::exp(s[j] - m));
  std::fill(s + n, s + width, 0.f);
  return total;
}

float max_row(const float* s, int64_t n) {
  Vec m(NEG_INF);
  int64_t j = 0;
  for (; j + VL <= n; j += VL) m = at::vec::maximum(m, Vec::loadu(s + j));
  float r = at::vec::vec_reduce_all<float>([](Vec& u, Vec& w) { return at::vec::maximum(u, w); }, m);
  for (; j < n; ++j) r = std::max(r, s[j]);
  return r;
}

// Run work(task, thread) for every task in [0, n_tasks), dynamically scheduled over torch's threads.
template <typename F>
void run_tasks(int64_t n_tasks, int64_t n_threads, const F& work) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, n_threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t thread = begin; thread < end; ++thread)
      for (int64_t t = next++; t < n_tasks; t = next++) work(t, thread);
  });
}

// A 4-D float32 tensor read by rows: row i of head h of batch b starts at at(b, h, i).
template <typename T>
struct Rows {
  T* p;
  int64_t sb, sh, ld;
  Rows(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 4 &&
                    t.stride(3) == 1,
                name, " must be a 4-D float32 CPU tensor with a contiguous last dim");
    p = static_cast<T*>(t.data_ptr<float>()), sb = t.stride(0), sh = t.stride(1), ld = t.stride(2);
  }
  T* at(int64_t b, int64_t h, int64_t i) const { return p + b * sb + h * sh + i * ld; }
};
using In = Rows<const float>;
using Out = Rows<float>;

struct Dims {
  int64_t B, H, Hkv, G, N, M, dk, dv, R, dr, W;
  Dims(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& qr) {
    B = q.size(0), H = q.size(1), N = q.size(2), dk = q.size(3);
    Hkv = k.size(1), M = k.size(2), G = H / Hkv, dv = v.size(3);
    R = qr.size(1), dr = qr.size(3), W = dv + R;
  }
};

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& qr,
                                           const at::Tensor& kr, bool causal, double scale,
                                           double rel_scale, int64_t bq, int64_t bk) {
  const In Q(q, "q"), K(k, "k"), V(v, "v"), QR(qr, "qr"), KR(kr, "kr");
  const Dims d(q, k, v, qr);
  TORCH_CHECK(d.M > 0, "relational attention needs at least one key");
  auto out = at::empty({d.B, d.H, d.N, d.W}, q.options());
  auto lse = at::empty({d.B, d.H, d.N}, q.options());
  float *O = out.data_ptr<float>(), *L = lse.data_ptr<float>();
  const int64_t n_qb = (d.N + bq - 1) / bq, n_threads = at::get_num_threads();
  const float fs = static_cast<float>(scale), frs = static_cast<float>(rel_scale);
  const int64_t tile = bq * bk;
  struct Buffers {
    std::vector<float> S, Rt, acc, accr, m, l;
  };
  std::vector<Buffers> buffers(n_threads);

  run_tasks(d.B * n_qb, n_threads, [&](int64_t task, int64_t thread) {
    Buffers& buf = buffers[thread];
    if (buf.S.empty()) {
      buf.S.resize(d.H * tile), buf.Rt.resize(d.R * tile), buf.acc.resize(d.H * bq * d.dv);
      buf.accr.resize(d.H * bq * d.R), buf.m.resize(d.H * bq), buf.l.resize(d.H * bq);
    }
    const int64_t b = task / n_qb, qb = n_qb - 1 - task % n_qb;  // the longest rows first
    const int64_t i0 = qb * bq, qn = std::min(d.N, i0 + bq) - i0;
    const int64_t kend = causal ? std::min(d.M, i0 + qn) : d.M;
    std::fill(buf.m.begin(), buf.m.end(), NEG_INF);
    std::fill(buf.l.begin(), buf.l.end(), 0.f);
    std::fill(buf.accr.begin(), buf.accr.end(), 0.f);
    std::fill(buf.acc.begin(), buf.acc.end(), 0.f);
    for (int64_t j0 = 0; j0 < kend; j0 += bk) {
      const int64_t jn = std::min(kend, j0 + bk) - j0;
      for (int64_t l = 0; l < d.R; ++l)  // relation tile, shared by all heads
        gemm(false, true, qn, jn, d.dr, frs, QR.at(b, l, i0), QR.ld, KR.at(b, l, j0), KR.ld, 0.f,
             buf.Rt.data() + l * tile, bk);
      for (int64_t h = 0; h < d.H; ++h) {
        float* S = buf.S.data() + h * tile;
        float* acc = buf.acc.data() + h * bq * d.dv;
        gemm(false, true, qn, jn, d.dk, fs, Q.at(b, h, i0), Q.ld, K.at(b, h / d.G, j0), K.ld,
             0.f, S, bk);
        for (int64_t i = 0; i < qn; ++i) {  // online softmax; rescale the running sums
          float* s = S + i * bk;
          const int64_t n = visible(causal, i0 + i, j0, jn);
          float& m = buf.m[h * bq + i];
          const float m_new = n > 0 ? std::max(m, max_row(s, n)) : m;
          const float alpha = m == NEG_INF ? 0.f : std::exp(m - m_new);
          m = m_new;
          buf.l[h * bq + i] = buf.l[h * bq + i] * alpha + exp_row(s, m_new, n, jn);
          if (alpha != 1.f) {
            at::vec::map([alpha](Vec x) { return x * Vec(alpha); }, acc + i * d.dv,
                         acc + i * d.dv, d.dv);
            for (int64_t l = 0; l < d.R; ++l) buf.accr[(h * bq + i) * d.R + l] *= alpha;
          }
        }
        gemm(false, false, qn, d.dv, jn, 1.f, S, bk, V.at(b, h / d.G, j0), V.ld, 1.f, acc, d.dv);
      }
      for (int64_t i = 0; i < qn; ++i) {  // accr[h, i, l] += sum_j p_ij^h r_ij^l
        const int64_t n = visible(causal, i0 + i, j0, jn);
        for_each_block(d.H, d.R, [&](int64_t h, int64_t l, auto fns) {
          fns.first(buf.S.data() + h * tile + i * bk, tile, buf.Rt.data() + l * tile + i * bk,
                    tile, n, buf.accr.data() + (h * bq + i) * d.R + l, bq * d.R);
        });
      }
    }
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < qn; ++i) {
        const float inv = 1.f / buf.l[h * bq + i];
        float* o = O + ((b * d.H + h) * d.N + i0 + i) * d.W;
        const float* acc = buf.acc.data() + (h * bq + i) * d.dv;
        for (int64_t c = 0; c < d.dv; ++c) o[c] = acc[c] * inv;
        for (int64_t l = 0; l < d.R; ++l) o[d.dv + l] = buf.accr[(h * bq + i) * d.R + l] * inv;
        L[(b * d.H + h) * d.N + i0 + i] = buf.m[h * bq + i] + std::log(buf.l[h * bq + i]);
      }
  });
  return {out, lse};
}

// Gradients (dq, dk, dv, dqr, dkr) given dout (B,H,N,dv+R), lse and delta_i = <dout_i, out_i>.
// Tasks are (batch, key block): each owns its dk, dv, dkr rows; dq and dqr go to per-thread
// buffers summed at the end.
std::vector<at::Tensor> backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& qr, const at::Tensor& kr,
                                 const at::Tensor& dout, const at::Tensor& lse,
                                 const at::Tensor& delta, bool causal, double scale,
                                 double rel_scale, int64_t bq, int64_t bk) {
  const In Q(q, "q"), K(k, "k"), V(v, "v"), QR(qr, "qr"), KR(kr, "kr"), DO(dout, "dout");
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous(), "lse and delta must be contiguous");
  const Dims d(q, k, v, qr);
  const int64_t n_threads = at::get_num_threads();
  auto dq_parts = at::zeros({n_threads, d.B, d.H, d.N, d.dk}, q.options());
  auto dqr_parts = at::zeros({n_threads, d.B, d.R, d.N, d.dr}, q.options());
  auto dk = at::zeros(k.sizes(), k.options()), dv = at::zeros(v.sizes(), v.options());
  auto dkr = at::zeros(kr.sizes(), kr.options());
  const float *LSE = lse.data_ptr<float>(), *DELTA = delta.data_ptr<float>();
  const Out DK(dk, "dk"), DV(dv, "dv"), DKR(dkr, "dkr");
  const int64_t n_kb = (d.M + bk - 1) / bk, tile = bq * bk;
  const float fs = static_cast<float>(scale), frs = static_cast<float>(rel_scale);
  struct Buffers {
    std::vector<float> P, dP, Rt, dR, c;
  };
  std::vector<Buffers> buffers(n_threads);

  run_tasks(d.B * n_kb, n_threads, [&](int64_t task, int64_t thread) {
    Buffers& buf = buffers[thread];
    if (buf.P.empty()) {
      buf.P.resize(d.H * tile), buf.dP.resize(d.H * tile), buf.Rt.resize(d.R * tile);
      buf.dR.resize(d.R * tile), buf.c.resize(d.H * d.R);
    }
    const Out DQ(dq_parts[thread], "dq"), DQR(dqr_parts[thread], "dqr");
    const int64_t b = task / n_kb, kb = task % n_kb;
    const int64_t j0 = kb * bk, jn = std::min(d.M, j0 + bk) - j0;
    const int64_t first_i = causal ? (j0 / bq) * bq : 0;
    for (int64_t i0 = first_i; i0 < d.N; i0 += bq) {
      const int64_t qn = std::min(d.N, i0 + bq) - i0;
      for (int64_t l = 0; l < d.R; ++l)
        gemm(false, true, qn, jn, d.dr, frs, QR.at(b, l, i0), QR.ld, KR.at(b, l, j0), KR.ld, 0.f,
             buf.Rt.data() + l * tile, bk);
      for (int64_t h = 0; h < d.H; ++h) {  // P = exp(S - lse), dP = dsym V^T
        const int64_t row = (b * d.H + h) * d.N + i0;
        float* P = buf.P.data() + h * tile;
        gemm(false, true, qn, jn, d.dk, fs, Q.at(b, h, i0), Q.ld, K.at(b, h / d.G, j0), K.ld, 0.f,
             P, bk);
        for (int64_t i = 0; i < qn; ++i)
          exp_row(P + i * bk, LSE[row + i], visible(causal, i0 + i, j0, jn), jn);
        gemm(false, true, qn, jn, d.dv, 1.f, DO.at(b, h, i0), DO.ld, V.at(b, h / d.G, j0), V.ld,
             0.f, buf.dP.data() + h * tile, bk);
      }
      std::fill(buf.dR.begin(), buf.dR.end(), 0.f);
      for (int64_t i = 0; i < qn; ++i) {  // dP^h += sum_l drel^{h,l} r^l; dR^l = sum_h drel^{h,l} P^h
        for (int64_t h = 0; h < d.H; ++h)
          for (int64_t l = 0; l < d.R; ++l)
            buf.c[h * d.R + l] = DO.at(b, h, i0 + i)[d.dv + l];
        const int64_t n = visible(causal, i0 + i, j0, jn);
        for_each_block(d.H, d.R, [&](int64_t h, int64_t l, auto fns) {
          fns.second(buf.P.data() + h * tile + i * bk, buf.dP.data() + h * tile + i * bk, tile,
                     buf.Rt.data() + l * tile + i * bk, buf.dR.data() + l * tile + i * bk, tile,
                     n, buf.c.data() + h * d.R + l, d.R);
        });
      }
      for (int64_t h = 0; h < d.H; ++h) {  // dS = P (dP - delta); dq, dk, dv
        const int64_t row = (b * d.H + h) * d.N + i0, kv = h / d.G;
        float *P = buf.P.data() + h * tile, *dS = buf.dP.data() + h * tile;
        for (int64_t i = 0; i < qn; ++i) {
          const Vec dl(DELTA[row + i]);
          at::vec::map2([dl](Vec p, Vec dp) { return p * (dp - dl); }, dS + i * bk, P + i * bk,
                        dS + i * bk, jn);
        }
        gemm(false, false, qn, d.dk, jn, fs, dS, bk, K.at(b, kv, j0), K.ld, 1.f, DQ.at(b, h, i0),
             DQ.ld);
        gemm(true, false, jn, d.dk, qn, fs, dS, bk, Q.at(b, h, i0), Q.ld, 1.f, DK.at(b, kv, j0),
             DK.ld);
        gemm(true, false, jn, d.dv, qn, 1.f, P, bk, DO.at(b, h, i0), DO.ld, 1.f, DV.at(b, kv, j0),
             DV.ld);
      }
      for (int64_t l = 0; l < d.R; ++l) {  // through r^l = rel_scale qr^l kr^l^T
        const float* dR = buf.dR.data() + l * tile;
        gemm(false, false, qn, d.dr, jn, frs, dR, bk, KR.at(b, l, j0), KR.ld, 1.f,
             DQR.at(b, l, i0), DQR.ld);
        gemm(true, false, jn, d.dr, qn, frs, dR, bk, QR.at(b, l, i0), QR.ld, 1.f,
             DKR.at(b, l, j0), DKR.ld);
      }
    }
  });
  return {dq_parts.sum(0), dk, dv, dqr_parts.sum(0), dkr};
}

std::string gemm_backend(bool aten) {
  use_aten_gemm = aten || sgemm_ == nullptr;
  return use_aten_gemm ? "at::mm" : "sgemm_";
}

}  // namespace

TORCH_LIBRARY(attn_zoo_relational_cpu, m) {
  m.def("forward", &forward);
  m.def("backward", &backward);
  m.def("gemm_backend", &gemm_backend);
}
