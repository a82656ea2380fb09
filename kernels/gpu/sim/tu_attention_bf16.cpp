// The plugin source attention_bf16.cu compiled as C++ against the emulator (PA_SIM).
#include "../attention_bf16.cu"
