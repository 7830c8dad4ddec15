// Computation on dlop_test: every operator without a kernel of its own.
//
// An operator whose output shapes its meta kernel can tell is queued on the
// current stream of its device and returns at once, with outputs allocated
// but not yet written: the stream's worker runs the CPU kernel on CPU views
// of the device memory when it gets there, holding the device's compute
// engine, and the operator takes at least its modelled time (Timing's op and
// tflops). The host runs ahead of the device, as on a GPU.
//
// The rest run at once on the calling thread, after the current streams of
// their devices have run what is queued: operators that return no tensor
// (item(), equal), whose output shapes depend on the data (nonzero), that
// draw random numbers (so that the CPU generator's draws keep the host's
// order), that name a device, or that span devices.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

namespace dlop::test_accelerator {

// The boxed kernel registered for the fallback and for convolution.
void compute(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// How many operators were queued to run later, and how many ran at once:
// tests check that a training step's operators are queued.
struct ComputeCounts {
  uint64_t queued = 0;
  uint64_t immediate = 0;
};
ComputeCounts compute_counts();

// The modelled FLOPs of an operator, from its arguments' shapes (0 for all
// but matrix products and convolutions).
double modelled_flops(const c10::OperatorHandle& op, const torch::jit::Stack& args, const at::Tensor& first_output);

}  // namespace dlop::test_accelerator
