// fsdp-cpp umbrella header.
#pragma once

#include "fsdp/accounting/memory.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/import_optimizer.h"
#include "fsdp/comm/backend.h"
#include "fsdp/comm/mpi_backend.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/common/check.h"
#include "fsdp/common/cpu_info.h"
#include "fsdp/optim/clip.h"
#include "fsdp/precision/grad_scaler.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/state_dict.h"
#include "fsdp/shard/layout.h"
