#include <cstdio>
int main() { std::puts("dlop-bench: placeholder"); return 0; }
