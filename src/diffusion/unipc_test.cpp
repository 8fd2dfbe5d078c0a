// The samplers against diffusers (UniPCMultistepScheduler as Wan 2.1 configures it, and
// FlowMatchEulerDiscreteScheduler): tests/reference/scheduler_reference.py writes diffusers'
// sigmas, timesteps and the trajectory for seeded random model outputs; every number here must
// equal it to 1e-6, absolute for values of magnitude below 1 and relative above
// (|ours - diffusers| <= 1e-6 * max(1, |diffusers|)); integer timesteps must be equal. Then
// Python-free checks: closed-form velocity fields whose ODE endpoint is known.
#include "diffusion/unipc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "diffusion/sampler.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {

constexpr double kTol = 1e-6;

// max over elements of |a - b| / max(1, |b|); 0 for two empty tensors.
double deviation(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.numel() == 0) return 0;
  at::Tensor x = a.to(at::kDouble).cpu(), y = b.to(at::kDouble).cpu();
  return ((x - y).abs() / y.abs().clamp_min(1.0)).max().item<double>();
}

struct Case {
  std::string kind;  // "unipc" or "euler"
  int64_t order;     // UniPC only
  int64_t steps;
  double shift;
  std::string spec() const {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f", shift);
    return kind == "unipc" ? "unipc:" + std::to_string(order) + ":" + std::to_string(steps) + ":" + s
                           : "euler:" + std::to_string(steps) + ":" + s;
  }
  std::string file() const {
    std::string f = spec();
    for (char& c : f)
      if (c == ':') c = '_';
    return f + ".safetensors";
  }
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> c;
    const std::vector<std::pair<int64_t, double>> grids = {{50, 3.0}, {50, 5.0}, {10, 1.0}, {3, 3.0}, {1, 5.0}, {2, 3.0}, {30, 7.5}};
    for (auto [steps, shift] : grids) c.push_back({"unipc", 2, steps, shift});
    c.push_back({"unipc", 1, 10, 3.0});
    c.push_back({"unipc", 3, 20, 5.0});
    for (auto [steps, shift] : grids) c.push_back({"euler", 0, steps, shift});
    return c;
  }();
  return all;
}

// Runs the Python reference once for every case; the reason it could not, or "".
class Reference {
 public:
  static Reference& get() {
    static Reference r;
    return r;
  }
  const std::string& missing() const { return missing_; }
  TensorMap load(const Case& c) const { return load_safetensors(dir_ / c.file()); }

 private:
  Reference() : dir_("scheduler_ref") {
#ifndef VIDIT_PYTHON
    missing_ = "built without VIDIT_PYTHON (no Python to run the diffusers reference)";
#else
    std::string cmd = std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR + "/tests/reference/scheduler_reference.py " + dir_.path();
    for (const Case& c : cases()) cmd += " " + c.spec();
    cmd += " 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) {
      missing_ = "cannot start " + cmd;
      return;
    }
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = pclose(p);
    if (status != 0)
      missing_ = "the diffusers reference (" + std::string(VIDIT_PYTHON) +
                 " tests/reference/scheduler_reference.py) did not run: " + out.substr(0, 600);
#endif
  }
  test::ScratchDir dir_;
  std::string missing_;
};

#define REQUIRE_REFERENCE()                                                            \
  do {                                                                                 \
    if (!Reference::get().missing().empty()) GTEST_SKIP() << Reference::get().missing(); \
  } while (0)

// A field that ignores its input and replays the reference's model outputs in order, recording
// the timesteps and samples it is given.
struct Replay {
  explicit Replay(at::Tensor outputs) : outputs(std::move(outputs)) {}
  at::Tensor outputs;  // [steps, B, ...]
  std::vector<at::Tensor> seen_t, seen_x;
  VelocityField field() {
    return [this](const at::Tensor& x, const at::Tensor& t, const at::Tensor&) {
      seen_t.push_back(t.clone());
      seen_x.push_back(x.clone());
      return outputs[int64_t(seen_t.size()) - 1].clone();
    };
  }
};

at::Tensor no_text(int64_t B) { return at::zeros({B, 1, 1}); }

TEST(UnipcDiffusers, SigmasAndTimesteps) {
  REQUIRE_REFERENCE();
  for (const Case& c : cases()) {
    if (c.kind != "unipc") continue;
    SCOPED_TRACE(c.spec());
    TensorMap ref = Reference::get().load(c);
    UniPCSolver::Options o;
    o.order = c.order;
    UniPCSolver s(o);
    s.set_timesteps(c.steps, c.shift);
    ASSERT_EQ(s.sigmas().scalar_type(), at::kFloat);
    ASSERT_EQ(s.timesteps().scalar_type(), at::kLong);
    EXPECT_LE(deviation(s.sigmas(), ref["sigmas"]), kTol);
    EXPECT_TRUE(at::equal(s.sigmas(), ref["sigmas"])) << "not bit-identical: " << (s.sigmas() - ref["sigmas"]).abs().max();
    EXPECT_TRUE(at::equal(s.timesteps(), ref["timesteps"])) << s.timesteps() << ref["timesteps"];
    EXPECT_TRUE(at::equal(unipc_sigmas(c.steps, c.shift), ref["sigmas"]));
    EXPECT_TRUE(at::equal(unipc_timesteps(c.steps, c.shift), ref["timesteps"]));
    EXPECT_EQ(s.sigmas()[c.steps].item<float>(), 0.0f);
  }
}

TEST(UnipcDiffusers, EveryStepMatches) {
  REQUIRE_REFERENCE();
  double worst = 0;
  for (const Case& c : cases()) {
    if (c.kind != "unipc") continue;
    SCOPED_TRACE(c.spec());
    TensorMap ref = Reference::get().load(c);
    UniPCSolver::Options o;
    o.order = c.order;
    UniPCSolver s(o);
    s.set_timesteps(c.steps, c.shift);
    at::Tensor x = ref["sample0"];
    double dev = 0;
    for (int64_t i = 0; i < c.steps; ++i) {
      // Each step from diffusers' own previous sample, so a deviation is this step's alone...
      at::Tensor got = s.step(ref["model_outputs"][i], i, i == 0 ? x : ref["outputs"][i - 1]);
      dev = std::max(dev, deviation(got, ref["outputs"][i]));
    }
    EXPECT_LE(dev, kTol);
    // ...and the whole trajectory from our own samples, with the solver reused (index 0 resets).
    for (int64_t i = 0; i < c.steps; ++i) {
      x = s.step(ref["model_outputs"][i], i, x);
      dev = std::max(dev, deviation(x, ref["outputs"][i]));
    }
    EXPECT_LE(dev, kTol);
    worst = std::max(worst, dev);
  }
  std::printf("UniPC vs diffusers: max deviation %.3g\n", worst);
}

TEST(UnipcDiffusers, SampleLoopFeedsDiffusersTimesteps) {
  REQUIRE_REFERENCE();
  for (const Case& c : cases()) {
    if (c.kind != "unipc" || c.order != 2) continue;
    SCOPED_TRACE(c.spec());
    TensorMap ref = Reference::get().load(c);
    Replay r(ref["model_outputs"]);
    const int64_t B = ref["sample0"].size(0);
    UniPCOptions opt;
    opt.steps = c.steps;
    opt.shift = c.shift;
    opt.cfg_scale = 1.0;
    at::Tensor out = unipc_sample(r.field(), ref["sample0"], no_text(B), at::zeros({1, 1}), opt);
    ASSERT_EQ(int64_t(r.seen_t.size()), c.steps);  // one model call per step without guidance
    for (int64_t i = 0; i < c.steps; ++i) {
      EXPECT_TRUE(at::equal(r.seen_t[i], at::full({B}, ref["timesteps"][i].item<double>())));
      if (i > 0) {
        EXPECT_LE(deviation(r.seen_x[i], ref["outputs"][i - 1]), kTol);
      }
    }
    EXPECT_LE(deviation(out, ref["outputs"][c.steps - 1]), kTol);
  }
}

TEST(FlowEulerDiffusers, SigmasAndTimesteps) {
  REQUIRE_REFERENCE();
  for (const Case& c : cases()) {
    if (c.kind != "euler") continue;
    SCOPED_TRACE(c.spec());
    TensorMap ref = Reference::get().load(c);
    at::Tensor sig = flow_euler_sigmas_diffusers(c.steps, c.shift);
    at::Tensor ts = flow_euler_timesteps_diffusers(c.steps, c.shift);
    ASSERT_EQ(sig.scalar_type(), at::kFloat);
    EXPECT_LE(deviation(sig, ref["sigmas"]), kTol);
    EXPECT_LE(deviation(ts, ref["timesteps"]), kTol);
    EXPECT_TRUE(at::equal(sig, ref["sigmas"])) << "not bit-identical: " << (sig - ref["sigmas"]).abs().max();
    EXPECT_TRUE(at::equal(ts, ref["timesteps"]));
  }
}

TEST(FlowEulerDiffusers, EveryStepMatches) {
  REQUIRE_REFERENCE();
  double worst = 0;
  for (const Case& c : cases()) {
    if (c.kind != "euler") continue;
    SCOPED_TRACE(c.spec());
    TensorMap ref = Reference::get().load(c);
    Replay r(ref["model_outputs"]);
    const int64_t B = ref["sample0"].size(0);
    EulerOptions opt{c.steps, c.shift, 1.0, EulerGrid::diffusers};
    at::Tensor out = euler_sample(r.field(), ref["sample0"], no_text(B), at::zeros({1, 1}), opt);
    ASSERT_EQ(int64_t(r.seen_t.size()), c.steps);
    double dev = 0;
    for (int64_t i = 0; i < c.steps; ++i) {
      EXPECT_TRUE(at::equal(r.seen_t[i], ref["timesteps"][i].expand({B})));
      if (i > 0) dev = std::max(dev, deviation(r.seen_x[i], ref["outputs"][i - 1]));
    }
    dev = std::max(dev, deviation(out, ref["outputs"][c.steps - 1]));
    EXPECT_LE(dev, kTol);
    worst = std::max(worst, dev);
  }
  std::printf("flow Euler vs diffusers: max deviation %.3g\n", worst);
}

// ---- without Python ----

TEST(FlowEulerGrids, DefaultGridIsUnchanged) {
  // The demo's grid: shift(linspace(1, 0, steps + 1)) in float64, timesteps sigma * 1000.
  EXPECT_EQ(EulerOptions{}.grid, EulerGrid::linear);
  at::Tensor sig = euler_sigmas(4, 3.0);
  ASSERT_EQ(sig.scalar_type(), at::kDouble);
  const double lin[] = {1.0, 0.75, 0.5, 0.25, 0.0};
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(sig[i].item<double>(), 3 * lin[i] / (1 + 2 * lin[i]));
  Replay r(at::zeros({4, 1, 2}));
  euler_sample(r.field(), at::ones({1, 2}), no_text(1), at::zeros({1, 1}), EulerOptions{4, 3.0, 1.0});
  ASSERT_EQ(r.seen_t.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(r.seen_t[i][0].item<float>(), float(sig[i].item<double>() * 1000));
}

TEST(FlowEulerGrids, DiffusersGridShape) {
  // shift 1: linspace(1, 0.001, steps) exactly, then 0.
  at::Tensor sig = flow_euler_sigmas_diffusers(4, 1.0);
  ASSERT_EQ(sig.size(0), 5);
  EXPECT_FLOAT_EQ(sig[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(sig[3].item<float>(), 0.001f);
  EXPECT_EQ(sig[4].item<float>(), 0.0f);
  // shift k: the last nonzero sigma is shift(shift(0.001)) (diffusers shifts twice there).
  auto sh = [](double s, double k) { return k * s / (1 + (k - 1) * s); };
  at::Tensor s3 = flow_euler_sigmas_diffusers(50, 3.0);
  EXPECT_NEAR(s3[49].item<float>(), sh(sh(0.001, 3.0), 3.0), 1e-6);
  EXPECT_TRUE((s3.narrow(0, 0, 50) > s3.narrow(0, 1, 50)).all().item<bool>());  // strictly decreasing
  EXPECT_THROW(flow_euler_sigmas_diffusers(0, 3.0), Error);
}

TEST(UnipcSolver, GridAndContracts) {
  UniPCSolver s;
  EXPECT_THROW(s.step(at::zeros({1, 2}), 0, at::zeros({1, 2})), Error);  // no set_timesteps
  s.set_timesteps(4, 1.0);
  // shift 1: linspace(1, 0.001, 5)[:4] with the first nudged to 1 - 1e-6, then 0.
  const double lin[] = {1.0 - 1e-6, 1.0 - 0.999 / 4, 1.0 - 2 * 0.999 / 4, 1.0 - 3 * 0.999 / 4, 0.0};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(s.sigmas()[i].item<float>(), float(lin[i]));
  EXPECT_EQ(s.timesteps()[0].item<int64_t>(), 999);
  EXPECT_EQ(s.timesteps()[1].item<int64_t>(), 750);
  at::Tensor x = at::randn({2, 3});
  x = s.step(at::randn({2, 3}), 0, x);
  EXPECT_THROW(s.step(at::randn({2, 3}), 2, x), Error);  // skipped step 1
  EXPECT_THROW(s.step(at::randn({2, 4}), 1, x), Error);  // shape mismatch
  EXPECT_THROW(s.step(at::randn({2, 3}), 4, x), Error);  // past the end
  EXPECT_NO_THROW(s.step(at::randn({2, 3}), 1, x));
  EXPECT_NO_THROW(s.step(at::randn({2, 3}), 0, x));  // a new trajectory
  EXPECT_THROW(UniPCSolver(UniPCSolver::Options{4}), Error);
  // bf16 samples come back bf16.
  at::Tensor xb = at::randn({2, 3}).to(at::kBFloat16);
  EXPECT_EQ(s.step(at::randn({2, 3}).to(at::kBFloat16), 0, xb).scalar_type(), at::kBFloat16);
}

// The straight path to a fixed x0: at sigma, x = (1 - sigma) x0 + sigma eps, so the exact
// velocity is v(x, sigma) = (x - x0) / sigma; every solver should land on x0.
at::Tensor straight_velocity(const at::Tensor& x, double sigma, const at::Tensor& x0) { return (x - x0) / sigma; }

TEST(UnipcConvergence, StraightPathLandsOnX0) {
  at::Tensor x0 = at::randn({2, 4, 3, 5}), eps = at::randn({2, 4, 3, 5});
  for (auto [steps, shift] : std::vector<std::pair<int64_t, double>>{{50, 3.0}, {10, 5.0}, {3, 1.0}, {1, 3.0}}) {
    UniPCSolver s;
    s.set_timesteps(steps, shift);
    at::Tensor x = eps;
    for (int64_t i = 0; i < steps; ++i) x = s.step(straight_velocity(x, s.sigmas()[i].item<double>(), x0), i, x);
    EXPECT_LT((x - x0).abs().max().item<double>(), 1e-5) << steps << " steps, shift " << shift;
  }
}

TEST(FlowEulerConvergence, StraightPathLandsOnX0) {
  at::Tensor x0 = at::randn({2, 4, 3, 5}), eps = at::randn({2, 4, 3, 5});
  auto field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor&) {
    return (x - x0) / (t.view({-1, 1, 1, 1}) / 1000);
  };
  for (EulerGrid g : {EulerGrid::linear, EulerGrid::diffusers})
    for (auto [steps, shift] : std::vector<std::pair<int64_t, double>>{{50, 3.0}, {10, 5.0}, {1, 3.0}}) {
      at::Tensor x = euler_sample(field, eps, no_text(2), at::zeros({1, 1}), EulerOptions{steps, shift, 1.0, g});
      EXPECT_LT((x - x0).abs().max().item<double>(), 1e-5) << steps << " steps, shift " << shift;
    }
}

// sigma of a UniPC model timestep, for fields that take the timestep.
double unipc_sigma_of(const at::Tensor& t, int64_t steps, double shift) {
  at::Tensor ts = unipc_timesteps(steps, shift), sig = unipc_sigmas(steps, shift);
  const int64_t want = int64_t(t[0].item<float>());
  for (int64_t i = 0; i < steps; ++i)
    if (ts[i].item<int64_t>() == want) return sig[i].item<double>();
  ADD_FAILURE() << "timestep " << want << " is not on the grid";
  return 1;
}

TEST(UnipcConvergence, GuidedSampleLandsOnTheGuidedBlend) {
  // v_text aims at a, v_neg at b: the guided field v_neg + g (v_text - v_neg) aims at
  // b + g (a - b), and both text halves come in one call of batch 2B.
  const int64_t B = 3, steps = 20;
  const double shift = 3.0, g = 4.0;
  at::Tensor a = at::randn({B, 2, 4}), b = at::randn({B, 2, 4}), eps = at::randn({B, 2, 4});
  at::Tensor text = at::ones({B, 2, 3}), negative = at::zeros({2, 3});
  int calls = 0;
  auto field = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& txt) {
    ++calls;
    EXPECT_EQ(x.size(0), 2 * B);
    EXPECT_EQ(txt.sizes(), (at::IntArrayRef{2 * B, 2, 3}));
    at::Tensor is_text = (txt.select(1, 0).select(1, 0) > 0.5).view({-1, 1, 1});
    at::Tensor target = at::where(is_text, at::cat({a, a}), at::cat({b, b}));
    return (x - target) / unipc_sigma_of(t, steps, shift);
  };
  UniPCOptions opt;
  opt.steps = steps;
  opt.shift = shift;
  opt.cfg_scale = g;
  at::Tensor x = unipc_sample(field, eps, text, negative, opt);
  EXPECT_EQ(calls, steps);
  EXPECT_LT((x - (b + g * (a - b))).abs().max().item<double>(), 1e-4);
  // The same through the config front door, and Euler (diffusers grid) agrees.
  SampleConfig cfg;
  cfg.solver = Solver::unipc;
  cfg.steps = steps;
  cfg.shift = shift;
  cfg.cfg_scale = g;
  EXPECT_TRUE(at::equal(sample_latents(field, eps, text, negative, cfg), x));
}

// Data: per element, an even mixture of N(-1, w^2) and N(+1, w^2), w^2 = 1/2. Along
// x = (1 - s) x0 + s eps the posterior mean E[x0 | x] is closed-form, so v = (x - E[x0 | x]) / s
// exactly; the paths curve (they split towards the two modes), so the solver's order shows.
at::Tensor mixture_velocity(const at::Tensor& x, double s) {
  const double w2 = 0.5, var = (1 - s) * (1 - s) * w2 + s * s;
  at::Tensor mean = at::zeros_like(x), norm = at::zeros_like(x);
  for (double m : {-1.0, 1.0}) {
    at::Tensor r = at::exp(-(x - (1 - s) * m).pow(2) / (2 * var));
    mean = mean + r * (m + (1 - s) * w2 / var * (x - (1 - s) * m));
    norm = norm + r;
  }
  return (x - mean / norm) / s;
}

TEST(UnipcConvergence, MoreAccurateThanEulerOnCurvedPaths) {
  at::Tensor eps = at::randn({1000}, at::kDouble);
  // Reference endpoint: 10000 Euler steps on the unshifted linear grid, in float64.
  at::Tensor ref = eps;
  const int64_t fine = 10000;
  for (int64_t i = 0; i < fine; ++i) {
    const double s = 1.0 - double(i) / fine, sn = 1.0 - double(i + 1) / fine;
    ref = ref + (sn - s) * mixture_velocity(ref, s);
  }
  const double shift = 3.0;
  auto unipc_error = [&](int64_t steps) {
    UniPCSolver u;
    u.set_timesteps(steps, shift);
    at::Tensor x = eps.to(at::kFloat);
    for (int64_t i = 0; i < steps; ++i)
      x = u.step(mixture_velocity(x.to(at::kDouble), u.sigmas()[i].item<double>()).to(at::kFloat), i, x);
    return (x.to(at::kDouble) - ref).abs().mean().item<double>();
  };
  auto euler_error = [&](int64_t steps) {
    at::Tensor sig = flow_euler_sigmas_diffusers(steps, shift).to(at::kDouble), x = eps;
    for (int64_t i = 0; i < steps; ++i)
      x = x + (sig[i + 1] - sig[i]).item<double>() * mixture_velocity(x, sig[i].item<double>());
    return (x - ref).abs().mean().item<double>();
  };
  const double u12 = unipc_error(12), u24 = unipc_error(24), e12 = euler_error(12), e24 = euler_error(24);
  std::printf("curved paths, mean |error| at 12 / 24 steps: UniPC %.3g / %.3g, Euler %.3g / %.3g\n", u12, u24, e12,
              e24);
  // (diffusers' own UniPC and Euler on this field: 0.028 / 0.009 and 0.12 / 0.06.)
  EXPECT_LT(u12, 0.4 * e12);
  EXPECT_LT(u24, 0.4 * e24);
  EXPECT_LT(u24, u12 / 2.5);  // better than first order: halving the step more than halves the error
  EXPECT_GT(e24, e12 / 2.5);  // while Euler is first order
}

}  // namespace
}  // namespace vidit
