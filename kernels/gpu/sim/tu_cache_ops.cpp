// The plugin source cache_ops.cu compiled as C++ against the emulator (PA_SIM).
#include "../cache_ops.cu"
