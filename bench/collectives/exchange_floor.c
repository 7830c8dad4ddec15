// The hardware floor of one small blocking all-reduce between two cores: two
// threads, one pinned to each core, exchange NB bytes through shared memory
// the way the `inline` all-reduce does (collectives/algorithms/
// allreduce_inline.cpp): copy the input into my box, post the exchange's
// sequence number with release semantics, wait until the peer's box holds it,
// sum both boxes; boxes alternate by parity. No library, no engine, no
// torch: what is left is the cache-line hand-over between the two cores, which
// a blocking all-reduce pays on every call (bench.c10d's `fake` floor
// does not, since it never waits for a peer). Prints ns per exchange.
//
//   cc -O2 -pthread -DNB=8 bench/collectives/exchange_floor.c -o /tmp/exchange_floor
//   /tmp/exchange_floor [EXCHANGES [CPU_A CPU_B]]   default: 200000 exchanges on CPUs 0 and 1
//
// NB: payload bytes, a multiple of 4 (floats), default 8. Run it on an idle
// machine, once per size (-DNB=8, -DNB=4096), several times: a descheduled
// thread shows as microseconds, not nanoseconds.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef NB
#define NB 8
#endif
#if NB < 4 || NB % 4 != 0
#error "NB must be a positive multiple of 4"
#endif

struct box {
  _Atomic long seq;
  char pad[56];
  float data[NB / 4];
} __attribute__((aligned(64)));
static struct box boxes[2][2];  // parity, side
static float in[2][NB / 4], out[2][NB / 4];
static long exchanges = 200000;
static int cpus[2] = {0, 1};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void run(int me) {
  for (long s = 1; s <= exchanges; s++) {
    struct box* mine = &boxes[s & 1][me];
    struct box* peer = &boxes[s & 1][1 - me];
    memcpy(mine->data, in[me], NB);
    atomic_store_explicit(&mine->seq, s, memory_order_release);
    while (atomic_load_explicit(&peer->seq, memory_order_acquire) < s) relax();
    for (int i = 0; i < NB / 4; i++) out[me][i] = mine->data[i] + peer->data[i];
  }
}

static void* other(void* arg) {
  (void)arg;
  run(1);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1) exchanges = atol(argv[1]);
  if (argc > 3) cpus[0] = atoi(argv[2]), cpus[1] = atoi(argv[3]);
  if (exchanges < 1 || argc == 3 || argc > 4) {
    fprintf(stderr, "usage: %s [EXCHANGES [CPU_A CPU_B]]\n", argv[0]);
    return 2;
  }
  for (int i = 0; i < NB / 4; i++) in[0][i] = (float)i, in[1][i] = (float)(2 * i);
  int err = pin(cpus[0]);
  if (err) {
    fprintf(stderr, "cannot pin to CPU %d: %s\n", cpus[0], strerror(err));
    return 1;
  }
  pthread_t t;
  pthread_attr_t attr;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpus[1], &s);
  pthread_attr_init(&attr);
  pthread_attr_setaffinity_np(&attr, sizeof s, &s);
  err = pthread_create(&t, &attr, other, 0);
  if (err) {
    fprintf(stderr, "cannot start a thread on CPU %d: %s\n", cpus[1], strerror(err));
    return 1;
  }
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  run(0);
  pthread_join(t, 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  for (int i = 0; i < NB / 4; i++) {
    if (out[0][i] != 3.0f * (float)i || out[1][i] != out[0][i]) {
      fprintf(stderr, "wrong sum at element %d\n", i);
      return 1;
    }
  }
  printf("%d B: %.1f ns per exchange (%ld exchanges, CPUs %d and %d)\n", NB,
         ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / exchanges, exchanges, cpus[0], cpus[1]);
  return 0;
}
