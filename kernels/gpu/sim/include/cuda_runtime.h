// cuda_runtime.h (gpusim) — the emulator in place of the CUDA runtime header: its host API
// (runtime.h) and the device built-ins (device.h). Only the gpusim builds see this folder.
#pragma once
#include "../runtime.h"
#include "../device.h"
