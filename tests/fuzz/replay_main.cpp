/* A main() for the fuzz targets without libFuzzer: runs the target once on every file given
 * (directories are walked one level deep), so the seed corpus replays as an ordinary test under
 * any compiler and sanitizer. Prints how many inputs ran; fails on an empty corpus. */
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static bool run_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "replay: cannot open %s\n", path.c_str());
    return false;
  }
  std::vector<uint8_t> buf;
  uint8_t chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) buf.insert(buf.end(), chunk, chunk + n);
  std::fclose(f);
  LLVMFuzzerTestOneInput(buf.data(), buf.size());
  return true;
}

int main(int argc, char** argv) {
  size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) {
      std::fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
      if (!run_file(argv[i])) return 1;
      ++ran;
      continue;
    }
    DIR* d = opendir(argv[i]);
    if (!d) return 1;
    std::vector<std::string> names;
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') names.push_back(std::string(argv[i]) + "/" + e->d_name);
    closedir(d);
    for (const auto& p : names) {
      if (!run_file(p)) return 1;
      ++ran;
    }
  }
  std::printf("replay: %zu inputs ran without a finding\n", ran);
  return ran > 0 ? 0 : 1;
}
