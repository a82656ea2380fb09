// The plugin source backend.cu compiled as C++ against the emulator (PA_SIM).
#include "../backend.cu"
