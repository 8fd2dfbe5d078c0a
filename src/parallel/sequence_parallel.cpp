#include "parallel/sequence_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "parallel/ring_attention.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor all_to_all(Comm& comm, const at::Tensor& in) {
  at::Tensor out = at::empty_like(in);
  comm.all_to_all(in, out)->wait();
  return out;
}

// [B, Lc, H, D] -> [B, n*Lc, H/n, D]
at::Tensor tokens_to_heads_op(Comm& comm, const at::Tensor& x) {
  const int64_t n = comm.size(), B = x.size(0), Lc = x.size(1), H = x.size(2), D = x.size(3);
  VIDIT_CHECK(H % n == 0, "Ulysses: ", H, " heads cannot be split over ", n, " processes");
  // Block j (heads j*H/n ...) goes to member j; block j received holds member j's tokens.
  at::Tensor in = x.reshape({B, Lc, n, H / n, D}).permute({2, 0, 1, 3, 4}).contiguous();
  return all_to_all(comm, in).permute({1, 0, 2, 3, 4}).reshape({B, n * Lc, H / n, D});
}

// [B, n*Lc, H/n, D] -> [B, Lc, H, D]
at::Tensor heads_to_tokens_op(Comm& comm, const at::Tensor& x) {
  const int64_t n = comm.size(), B = x.size(0), L = x.size(1), Hn = x.size(2), D = x.size(3);
  VIDIT_CHECK(L % n == 0, "Ulysses: ", L, " tokens cannot be split over ", n, " processes");
  // Block j (tokens of member j) goes to member j; block j received holds member j's heads.
  at::Tensor in = x.reshape({B, n, L / n, Hn, D}).permute({1, 0, 2, 3, 4}).contiguous();
  return all_to_all(comm, in).permute({1, 2, 0, 3, 4}).reshape({B, L / n, n * Hn, D});
}

// An all-to-all whose backward is its inverse exchange.
template <at::Tensor (*Forward)(Comm&, const at::Tensor&), at::Tensor (*Inverse)(Comm&, const at::Tensor&)>
class Exchange : public torch::autograd::Function<Exchange<Forward, Inverse>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return Forward(comm_at(comm), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {Inverse(comm_at(ctx->saved_data["comm"].toInt()), g[0]), at::Tensor()};
  }
};
using TokensToHeads = Exchange<tokens_to_heads_op, heads_to_tokens_op>;
using HeadsToTokens = Exchange<heads_to_tokens_op, tokens_to_heads_op>;

class GatherTokens : public torch::autograd::Function<GatherTokens> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    Comm& c = comm_at(comm);
    ctx->saved_data["chunk"] = x.size(1);
    ctx->saved_data["rank"] = int64_t(c.rank());
    at::Tensor in = x.transpose(0, 1).contiguous();  // [Lc, B, C]: the gather concatenates dim 0
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] *= c.size();
    at::Tensor out = at::empty(shape, in.options());
    c.all_gather(in, out)->wait();
    return out.transpose(0, 1).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), rank = ctx->saved_data["rank"].toInt();
    return {g[0].narrow(1, rank * chunk, chunk).contiguous(), at::Tensor()};
  }
};

}  // namespace

at::Tensor tokens_to_heads(const at::Tensor& x, const std::shared_ptr<Comm>& comm) {
  return comm->size() == 1 ? x : TokensToHeads::apply(x, comm_address(comm));
}

at::Tensor heads_to_tokens(const at::Tensor& x, const std::shared_ptr<Comm>& comm) {
  return comm->size() == 1 ? x : HeadsToTokens::apply(x, comm_address(comm));
}

at::Tensor gather_tokens(const at::Tensor& x, const std::shared_ptr<Comm>& comm) {
  return comm->size() == 1 ? x : GatherTokens::apply(x, comm_address(comm));
}

AttentionFn ulysses_attention(std::shared_ptr<Comm> ulysses, AttentionFn inner) {
  return [ulysses, inner](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const int64_t D = q.size(3);
    at::Tensor o = inner(tokens_to_heads(q, ulysses), tokens_to_heads(k, ulysses), tokens_to_heads(v, ulysses));
    return heads_to_tokens(o.unflatten(2, {-1, D}), ulysses).flatten(2);
  };
}

void apply_sequence_parallel(ParallelModel& pm) {
  DiTImpl& model = *pm.model();
  const Mesh& mesh = pm.mesh();
  const int sp = mesh.degree("sp");
  if (sp == 1) return;
  std::shared_ptr<Comm> sp_group = mesh.group("sp"), ring = mesh.group("ring"), ulysses = mesh.group("ulysses");
  const int64_t chunk_index = mesh.coord("sp");
  model.token_split.scatter = [sp, chunk_index](const at::Tensor& t, int64_t dim) {
    const int64_t L = t.size(dim);
    VIDIT_CHECK(L % sp == 0, "sequence parallel: a sample of ", L, " tokens cannot be split over parallel.ulysses x "
                "parallel.ring = ", sp, " processes; choose buckets (or data.latent_*) whose token counts are "
                "divisible by ", sp);
    return t.narrow(dim, chunk_index * (L / sp), L / sp).contiguous();
  };
  model.token_split.gather = [sp_group](const at::Tensor& t) { return gather_tokens(t, sp_group); };

  AttentionFn inner = attention;
  if (ring->size() > 1)
    inner = [ring](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return ring_attention(q, k, v, ring);
    };
  AttentionFn fn = ulysses->size() > 1 ? ulysses_attention(ulysses, inner) : inner;
  for (auto& b : *model.blocks) b->as<DiTBlockImpl>()->self_attn->attention_fn = fn;
}

}  // namespace vidit
