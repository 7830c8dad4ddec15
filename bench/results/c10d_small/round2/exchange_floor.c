// The hardware floor of one small all-reduce between two cores: two threads
// (one per core) exchange NB bytes through shared memory the way the inline
// all-reduce does (copy into my box, post the round, wait for the peer's,
// sum both boxes), alternating boxes by parity. Prints ns per round.
//   gcc -O2 -mavx2 -DNB=8 exchange_floor.c -lpthread && ./a.out
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#ifndef NB
#define NB 8
#endif
struct box {
  _Atomic long seq;
  char pad[56];
  float data[NB / 4];
} __attribute__((aligned(64)));
static struct box boxes[2][2];  // parity, rank
enum { kRounds = 200000 };
static float in[2][NB / 4], out[2][NB / 4];

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void run(int me) {
  for (long s = 1; s <= kRounds; s++) {
    struct box* mine = &boxes[s & 1][me];
    struct box* peer = &boxes[s & 1][1 - me];
    memcpy(mine->data, in[me], NB);
    atomic_store_explicit(&mine->seq, s, memory_order_release);
    while (atomic_load_explicit(&peer->seq, memory_order_acquire) < s) __builtin_ia32_pause();
    for (int i = 0; i < NB / 4; i++) out[me][i] = mine->data[i] + peer->data[i];
  }
}

static void* other(void* arg) {
  (void)arg;
  pin(1);
  run(1);
  return 0;
}

int main(void) {
  pthread_t t;
  struct timespec a, b;
  pin(0);
  pthread_create(&t, 0, other, 0);
  clock_gettime(CLOCK_MONOTONIC, &a);
  run(0);
  pthread_join(t, 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%d B: %.1f ns per round\n", NB, ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / kRounds);
  return 0;
}
