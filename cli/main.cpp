#include <cstdio>

#include "qforge/version.h"

int main() {
  std::printf("qforge %s\n", qforge::kVersion);
  return 0;
}
