// The plugin source mla.cu compiled as C++ against the emulator (PA_SIM).
#include "../mla.cu"
