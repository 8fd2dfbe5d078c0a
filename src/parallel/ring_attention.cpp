#include "parallel/ring_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <optional>

#include "core/error.h"

namespace vidit {

namespace {

at::ScalarType accum_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

std::array<at::Tensor, 2> attention_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.is_cpu()) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v);
    return {out, lse};
  }
  const auto real = accum_type(q);
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  at::Tensor s = at::matmul(q.to(real), k.to(real).transpose(-2, -1)) * scale;
  at::Tensor lse = s.logsumexp(-1);
  at::Tensor out = at::matmul((s - lse.unsqueeze(-1)).exp(), v.to(real));
  return {out.to(q.scalar_type()), lse};
}

std::array<at::Tensor, 3> attention_block_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                   const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& out, const at::Tensor& lse) {
  if (q.is_cpu()) {
    auto [dq, dk, dv] =
        at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, false);
    return {dq, dk, dv};
  }
  // P = exp(S - lse); dV = P^T dO; dS = P * (dO V^T - rowsum(dO * O)); dQ = dS K s; dK = dS^T Q s.
  const auto real = accum_type(q);
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  at::Tensor qf = q.to(real), kf = k.to(real), vf = v.to(real), go = grad_out.to(real);
  at::Tensor p = (at::matmul(qf, kf.transpose(-2, -1)) * scale - lse.to(real).unsqueeze(-1)).exp();
  at::Tensor dv = at::matmul(p.transpose(-2, -1), go);
  at::Tensor d = (go * out.to(real)).sum(-1, /*keepdim=*/true);
  at::Tensor ds = p * (at::matmul(go, vf.transpose(-2, -1)) - d);
  at::Tensor dq = at::matmul(ds, kf) * scale, dk = at::matmul(ds.transpose(-2, -1), qf) * scale;
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One hop around the ring: `block` goes to the next member while the previous member's arrives.
struct Hop {
  at::Tensor incoming;
  WorkPtr send, recv;
  at::Tensor wait() {
    send->wait();
    recv->wait();
    return incoming;
  }
};

// Tags: 0 for key / value blocks, 1 for their gradients.
Hop hop(Comm& ring, const at::Tensor& block, int tag = 0) {
  const int n = ring.size(), r = ring.rank();
  Hop h;
  h.incoming = at::empty_like(block);
  h.send = ring.send(block, (r + 1) % n, tag);
  h.recv = ring.recv(h.incoming, (r - 1 + n) % n, tag);
  return h;
}

// The communicator rides in the autograd context as an address: the model's attention function
// holds the shared_ptr, so it outlives every graph built with it.
Comm& comm_of(AutogradContext* ctx) { return comm_at(ctx->saved_data["comm"].toInt()); }

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  // q, k, v [B, Lc, H, D] -> [B, Lc, H * D]
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t comm) {
    Comm& ring = comm_at(comm);
    const int n = ring.size();
    const auto real = accum_type(q);
    at::Tensor qt = q.transpose(1, 2).contiguous();
    at::Tensor kv = at::stack({k.transpose(1, 2), v.to(k.scalar_type()).transpose(1, 2)}).contiguous();
    at::Tensor out, lse, block = kv;
    // At step s this member holds the block of member (rank - s) mod n.
    for (int s = 0; s < n; ++s) {
      std::optional<Hop> next;
      if (s + 1 < n) next = hop(ring, block);
      auto [o, l] = attention_block(qt, block[0], block[1]);
      if (!out.defined()) {
        out = o.to(real), lse = l.to(real);
      } else {  // online softmax: rescale both partial results to the merged log-sum-exp
        at::Tensor merged = at::logaddexp(lse, l.to(real));
        out = out * (lse - merged).exp().unsqueeze(-1) + o.to(real) * (l.to(real) - merged).exp().unsqueeze(-1);
        lse = merged;
      }
      if (next) block = next->wait();
    }
    out = out.to(q.scalar_type());
    ctx->save_for_backward({qt, kv, out, lse});
    ctx->saved_data["comm"] = comm;
    return out.transpose(1, 2).flatten(2);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Comm& ring = comm_of(ctx);
    const int n = ring.size();
    auto saved = ctx->get_saved_variables();
    const at::Tensor &qt = saved[0], &kv = saved[1], &out = saved[2], &lse = saved[3];
    const int64_t B = qt.size(0), H = qt.size(1), Lc = qt.size(2), D = qt.size(3);
    const auto real = accum_type(qt);
    at::Tensor go = grads[0].reshape({B, Lc, H, D}).transpose(1, 2).contiguous().to(qt.scalar_type());
    at::Tensor dq = at::zeros(qt.sizes(), qt.options().dtype(real));
    // dkv travels with the block it belongs to, collecting each member's share.
    at::Tensor block = kv, dkv = at::zeros(kv.sizes(), kv.options().dtype(real));
    for (int s = 0; s < n; ++s) {
      std::optional<Hop> next;
      if (s + 1 < n) next = hop(ring, block);
      auto [a, b, c] = attention_block_backward(go, qt, block[0], block[1], out, lse);
      dq += a.to(real);
      dkv[0] += b.to(real);
      dkv[1] += c.to(real);
      // After the last step this member holds the block of member rank + 1: that hop is home.
      if (n > 1) dkv = hop(ring, dkv, /*tag=*/1).wait();
      if (next) block = next->wait();
    }
    auto back = [&](const at::Tensor& t) { return t.transpose(1, 2).to(qt.scalar_type()); };
    return {back(dq), back(dkv[0]), back(dkv[1]), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::shared_ptr<Comm>& ring) {
  VIDIT_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && k.sizes() == v.sizes(),
              "ring attention: q, k, v must be [B, L, heads, head_dim] of one shape (got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes(), ")");
  return RingAttention::apply(q, k, v, comm_address(ring));
}

}  // namespace vidit
