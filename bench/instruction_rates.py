"""How often this CPU starts the vector instructions the attention could use: a float32
multiply-add (VFMADD, 16 lanes), a bfloat16 pair dot product (VDPBF16PS, AVX512_BF16), an
int8 and an int16 dot product (VPDPBUSD, VPDPWSSD: AVX512_VNNI), each in 12 independent
chains of 512-bit registers, so the rate the core starts them is measured, not their
latency.

    .venv/bin/python -m bench.instruction_rates [--iterations 100000000]

Compiles a small C program with gcc into a temporary folder and runs it on one thread;
prints nanoseconds per instruction and the clock a dependent chain of adds gives. An
instruction this CPU lacks is reported as such (its code is never run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f"), noinline)) static float fma_chains(long n) {
  __m512 a[12];
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.5f);
  for (long k = 0; k < n; k++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
  }
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  return s;
}

__attribute__((target("avx512f,avx512bf16"), noinline)) static float bf16_chains(long n) {
  __m512 a[12];
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f00);
  for (long k = 0; k < n; k++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  }
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  return s;
}

/* words: VPDPWSSD (pairs of int16), else VPDPBUSD (quads of int8) */
__attribute__((target("avx512f,avx512vnni"), noinline)) static int vnni_chains(long n, int words) {
  __m512i a[12];
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(2);
  for (long k = 0; k < n; k++) {
    if (words) {
      _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpwssd_epi32(a[i], x, y);
    } else {
      _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    }
  }
  int s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
  return s;
}

int main(int argc, char** argv) {
  long n = 100000000;
  if (argc > 1) sscanf(argv[1], "%ld", &n);
  __builtin_cpu_init();
  double t = now();
  long x = 0;
  for (long i = 0; i < n; i++) __asm__ volatile("add $1, %0" : "+r"(x));
  const double ghz = n / (now() - t) / 1e9;
  double fma = -1, bf16 = -1, vnni = -1, words = -1;
  volatile float sink = 0;
  if (__builtin_cpu_supports("avx512f")) {
    t = now(); sink += fma_chains(n / 4); fma = (now() - t) / (n / 4) / 12 * 1e9;
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    t = now(); sink += bf16_chains(n / 4); bf16 = (now() - t) / (n / 4) / 12 * 1e9;
  }
  if (__builtin_cpu_supports("avx512vnni")) {
    t = now(); sink += (float)vnni_chains(n / 4, 0); vnni = (now() - t) / (n / 4) / 12 * 1e9;
    t = now(); sink += (float)vnni_chains(n / 4, 1); words = (now() - t) / (n / 4) / 12 * 1e9;
  }
  printf("{\"clock_ghz\": %.3f, \"vfmadd_ns\": %.4f, ", ghz, fma);
  printf("\"vdpbf16ps_ns\": %.4f, \"vpdpbusd_ns\": %.4f, ", bf16, vnni);
  printf("\"vpdpwssd_ns\": %.4f}\n", words);
  return 0;
}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=100_000_000)
    args = p.parse_args(argv)
    cc = shutil.which("gcc")
    if cc is None:
        raise SystemExit("gcc is needed to build the measurement (apt-get install gcc)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "rates.c", Path(tmp) / "rates"
        src.write_text(SOURCE, encoding="utf-8")
        built = subprocess.run([cc, "-O3", "-o", str(exe), str(src)], capture_output=True,
                               text=True)
        if built.returncode != 0:
            raise SystemExit("gcc could not build it (an older gcc lacks AVX512_BF16):\n"
                             + built.stderr[-2000:])
        out = subprocess.run([str(exe), str(args.iterations)], capture_output=True, text=True,
                             check=True).stdout
    got = json.loads(out)
    print(f"clock (a chain of dependent adds): {got['clock_ghz']:.2f} GHz")
    for key, name in (("vfmadd_ns", "VFMADD231PS zmm (16 float32 multiply-adds)"),
                      ("vdpbf16ps_ns", "VDPBF16PS zmm (32 bfloat16 products)"),
                      ("vpdpbusd_ns", "VPDPBUSD zmm (64 int8 products)"),
                      ("vpdpwssd_ns", "VPDPWSSD zmm (32 int16 products)")):
        ns = got[key]
        text = "not on this CPU" if ns < 0 else (
            f"{ns:.3f} ns each, {1 / (ns * got['clock_ghz']):.2f} a cycle")
        print(f"{name}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
