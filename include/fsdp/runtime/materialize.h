// Deferred (meta-device) initialisation: a model built on the meta device is sharded first, then
// each rank writes only its own rows, module by module, with the values a normal initialisation
// gives (layer 3). docs/architecture.md, "[Note: deferred initialisation]".
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace fsdp {

/// Initialises in place the parameters and buffers that `module` registers itself (not those of
/// its children): they are CPU tensors of their full shapes and dtypes when called. It may draw
/// from the global torch generator and must read nothing but the module's configuration (no other
/// module's values, no values of the tensors it writes). Called with grad mode off.
/// qualified_name: the module's name from the root ("" for the root, "h.0.attn", ...).
using ModuleInit = std::function<void(const std::string& qualified_name, torch::nn::Module& module)>;

/// The normal initialisation of a model whose tensors hold memory: calls init on every module of
/// root's tree in pre-order (a module before its children, children in registration order: the
/// order of Module::named_modules), skipping the FSDP state holders. Not collective.
void init_parameters(torch::nn::Module& root, const ModuleInit& init);

/// What materialize did on this rank.
struct MaterializeResult {
  int64_t modules = 0;          ///< modules init was called on (those registering params or buffers)
  int64_t param_bytes = 0;      ///< full (unsharded) bytes of every param written, tied ones once
  int64_t peak_full_bytes = 0;  ///< most full bytes held at once: one module's own params and buffers,
                                ///< plus tied params waiting for their last module
};

/// Writes this rank's rows of every parameter of root's tree, which was built on the meta device
/// and sharded (fully_shard / fully_shard_tree over a real group, which allocates the shards and
/// leaves them pending). Visits the modules in the order init_parameters does; for each module
/// that registers params or buffers it allocates that module's own params at full size on the
/// CPU, runs init, copies this rank's rows into the owning unit's shards, frees the full tensors,
/// and keeps the module's buffers (not sharded) in full. So the generator is drawn in the same
/// order with the same sizes as init_parameters on a CPU model, and the shards are bitwise those
/// of a model initialised by init_parameters and then sharded, while no more than one module's
/// full params exist at a time (peak_full_bytes). A parameter registered by several modules (tied
/// weights) stays full from its first module to its last, so each module's init sees what the
/// earlier ones wrote, as on a built model. Every rank draws the whole model's values (compute
/// O(params), memory O(largest module)).
/// init must write every parameter (in one of the modules registering it) and every buffer built
/// on the meta device, with tensor operations (normal_, copy_, fill_, ... or set_data): the meta
/// device computes no values, so a table the constructor computes (rotary frequencies) must be
/// computed again in init, or built on the CPU in the constructor.
/// Not collective (no communication); every rank calls it with the same generator state (same
/// seed) and the same init, like any initialisation. Blocking.
/// Throws fsdp::Error (kInvalidArgument): a parameter owned by no unit, a unit's parameters
/// already holding values (built off the meta device, or materialised before), a parameter or
/// meta buffer init did not write (named); kUnsupported on a simulated group (a dry run holds no
/// values).
MaterializeResult materialize(const std::shared_ptr<torch::nn::Module>& root, const ModuleInit& init);

}  // namespace fsdp
