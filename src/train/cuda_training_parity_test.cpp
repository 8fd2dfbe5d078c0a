// GPU parity of training: the same config trains to the CPU's losses on CUDA (fp32, TF32 off;
// bf16 near them); the asynchronous checkpoint of a run on the GPU snapshots into reused pinned
// buffers and equals the synchronous save bit for bit; the GPU events time the device, and a
// step's busy time on it lies within its host time. Every test skips where no CUDA device is
// present (CI); bench/gpu/run.sh runs them on a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "../../tests/test_util.h"
#include "core/cuda_parity_test_util.h"
#include "core/gpu_events.h"
#include "core/precision.h"
#include "loader/dataset.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_writer.h"
#include "train/trainer.h"

namespace vidit {
namespace {

using cuda_parity::NoTf32;
using test::ScratchDir;
using test::tiny_config;

// The trainer draws noise, timesteps and caption drops from a CPU generator and initialises the
// model on the CPU, so the same config trains to the same losses on either device.
std::vector<double> train_losses(Precision precision, at::Device device, int steps) {
  Config c = tiny_config({"model.dim=64", "model.heads=4", "model.ffn_dim=128", "train.lr=1e-3",
                          "train.warmup_steps=0", "checkpoint.every=0", "train.ema_decay=0"});
  c.train.precision = precision;
  test::ScratchDir dir("cuda_step");
  c.train.out_dir = dir.path();
  c.train.steps = steps;
  auto data = std::make_shared<SyntheticDataset>(c, 64, 7);
  Trainer trainer(c, data, at::zeros({c.model.text_len, c.model.text_dim}), device);
  return trainer.fit(-1, /*console=*/false);
}

TEST(CudaParity, TrainingOnCudaReproducesCpuLosses) {
  SKIP_WITHOUT_CUDA();
  NoTf32 fp32;
  const int steps = 20;
  std::vector<double> cpu = train_losses(Precision::fp32, at::kCPU, steps);
  std::vector<double> gpu = train_losses(Precision::fp32, at::kCUDA, steps);
  std::vector<double> bf16 = train_losses(Precision::bf16, at::kCUDA, steps);
  ASSERT_EQ(gpu.size(), size_t(steps));
  ASSERT_EQ(bf16.size(), size_t(steps));
  double worst = 0, bf16_mean = 0;
  for (int i = 0; i < steps; ++i) {
    worst = std::max(worst, std::abs(gpu[i] - cpu[i]) / std::abs(cpu[i]));
    ASSERT_TRUE(std::isfinite(bf16[i])) << "step " << i;
    bf16_mean += std::abs(bf16[i] - cpu[i]) / std::abs(cpu[i]) / steps;
  }
  std::printf("GPU_PARITY train_loss_fp32 %.3e\nGPU_PARITY train_loss_bf16_mean %.3e\n", worst, bf16_mean);
  EXPECT_LT(worst, 1e-3);
  EXPECT_LT(bf16_mean, 0.05);
}

// The asynchronous checkpoint of a run on the GPU: the snapshot goes into pinned host buffers,
// reused from one save to the next, and the checkpoint written from them in the background (slow
// storage on the save of step 2) equals, bit for bit, a synchronous save of the same run.
TEST(CudaParity, AsyncCheckpointSnapshotsIntoPinnedBuffersAndEqualsTheSyncSave) {
  SKIP_WITHOUT_CUDA();
  TensorMap state{{"w", at::randn({64, 33}, at::kCUDA)}, {"b", at::randn({7}, at::kCUDA).to(at::kBFloat16)}};
  TensorMap buffers;
  TensorMap first = snapshot(state, buffers);
  for (const auto& [key, t] : first) {
    EXPECT_TRUE(t.is_pinned()) << key;
    EXPECT_TRUE(at::equal(t, state.at(key).cpu())) << key;
  }
  const void* w = buffers.at("w").data_ptr();
  state.at("w").add_(1);
  TensorMap second = snapshot(state, buffers);
  EXPECT_EQ(second.at("w").data_ptr(), w) << "the buffers are reused";
  EXPECT_TRUE(at::equal(second.at("w"), state.at("w").cpu()));

  ScratchDir a("cuda_async_save"), b("cuda_sync_save");
  // Two trainers compared bit for bit: deterministic kernels (cuDNN's convolutions, the math
  // attention kernel, whose backward has no atomics).
  struct Deterministic {
    bool before = at::globalContext().deterministicCuDNN();
    Deterministic() { at::globalContext().setDeterministicCuDNN(true); }
    ~Deterministic() { at::globalContext().setDeterministicCuDNN(before); }
  } deterministic;
  auto config = [](const std::string& out, bool async) {
    return tiny_config({"train.steps=4", "train.out_dir=\"" + out + "\"", std::string("checkpoint.async=") + (async ? "true" : "false"),
                        "train.attention_backend=\"math\"", "faults.kind=\"slow_storage\"", "faults.step=2",
                        "faults.seconds=0.3"});
  };
  Config ca = config(a.path(), true), cb = config(b.path(), false);
  auto text = at::zeros({ca.model.text_len, ca.model.text_dim});
  Trainer t(ca, std::make_shared<SyntheticDataset>(ca, 64, 7), text, at::kCUDA);
  Trainer u(cb, std::make_shared<SyntheticDataset>(cb, 64, 7), text, at::kCUDA);
  t.step(), t.step();
  t.start_save();
  t.step();  // training goes on while the writer writes
  const std::string dir = t.finish_save();
  ASSERT_FALSE(dir.empty());
  u.step(), u.step();
  const CheckpointState x = load_checkpoint(dir), y = load_checkpoint(u.save());
  EXPECT_EQ(x.step, 2);
  for (const TensorMap* m : {&x.model, &x.ema, &x.optimizer})
    for (const auto& [key, v] : *m) {
      const TensorMap& other = m == &x.model ? y.model : m == &x.ema ? y.ema : y.optimizer;
      EXPECT_TRUE(at::equal(v, other.at(key))) << key;
    }
}

// Device time, not host time: launching work returns at once, the events measure it running;
// a training step's busy time on the device is positive and within its host time.
TEST(CudaParity, GpuEventsTimeTheDeviceAndTheStepsBusyTime) {
  SKIP_WITHOUT_CUDA();
  const at::Tensor a = at::randn({4096, 4096}, at::kCUDA);
  at::Tensor b = a;
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  const GpuEventPtr start = record_gpu_event(0);
  for (int i = 0; i < 20; ++i) b = at::matmul(b, a) * (1.0 / 64);
  const GpuEventPtr end = record_gpu_event(0);
  const double launch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double device_s = gpu_seconds_between(start, end);
  const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("GPU_PARITY gpu_events launch %.2e s device %.2e s host %.2e s\n", launch_s, device_s, host_s);
  EXPECT_GT(device_s, 0);
  EXPECT_LE(device_s, host_s * 1.01);
  EXPECT_EQ(record_gpu_event(-1), nullptr);

  ScratchDir dir("cuda_busy");
  const Config c = tiny_config({"train.steps=3", "train.out_dir=\"" + dir.path() + "\""});
  Trainer t(c, std::make_shared<SyntheticDataset>(c, 32, 11), at::zeros({c.model.text_len, c.model.text_dim}), at::kCUDA);
  for (int i = 0; i < 3; ++i) {
    const StepResult r = t.step();
    EXPECT_GT(r.device_busy_s, 0) << "step " << r.step;
    EXPECT_LE(r.device_busy_s, r.seconds * 1.01) << "step " << r.step;
  }
}

}  // namespace
}  // namespace vidit
