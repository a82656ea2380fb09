// The plugin source attention_f16.cu compiled as C++ against the emulator (PA_SIM).
#include "../attention_f16.cu"
