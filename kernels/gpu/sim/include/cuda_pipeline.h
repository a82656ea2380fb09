// cuda_pipeline.h (gpusim) — cp.async as deferred copies (pipeline.h).
#pragma once
#include "../pipeline.h"
