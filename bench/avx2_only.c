// An AVX2-only x86-64 CPU, as onnxruntime (and anything else in the process) sees it: preloaded
// (LD_PRELOAD), this library turns on Linux's CPUID faulting for the process (arch_prctl ARCH_SET_CPUID 0;
// the CPU must list cpuid_fault in /proc/cpuinfo), so each later `cpuid` instruction traps into the SIGSEGV
// handler below, which runs the real one and clears the AVX-512 and VNNI feature bits before the program sees
// them. Libraries that pick kernels by cpuid at run time (onnxruntime's MLAS, oneDNN, numpy) then take their AVX2
// paths, as on the AVX2-only AMD EPYC machines the project also runs on. The setting is per thread and inherited
// by the threads the process starts later; exec clears it. Libraries that install their own SIGSEGV handler
// later (TVM's backtrace printer does) get it chained behind this one: sigaction and signal are wrapped.
//
// What it cannot change: the microarchitecture (the same cores run the AVX2 code), and what was read before
// it ran (ld.so's and glibc's own feature checks, which pick memcpy and friends). bench/int8_cpu.py --cpu avx2
// builds it (gcc -shared -fPIC -O2) and re-runs itself with it preloaded; EDGEDEPLOY_AVX2_ONLY=1 says it
// took effect.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction*, struct sigaction*);

static sigaction_fn real_sigaction(void) {
  static sigaction_fn fn;
  if (!fn) fn = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  return fn;
}

static struct sigaction chained;  // the SIGSEGV handler the program asked for, run for real faults

static int set_cpuid(int enabled) { return (int)syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

// leaf 7 subleaf 0: EBX AVX512F DQ IFMA PF ER CD BW VL; ECX VBMI VBMI2 VNNI BITALG VPOPCNTDQ;
// EDX 4VNNIW 4FMAPS VP2INTERSECT FP16. Leaf 7 subleaf 1: EAX AVX-VNNI, AVX512_BF16.
#define BIT(n) (1u << (n))
static const uint32_t kLeaf7Ebx = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31);
static const uint32_t kLeaf7Ecx = BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14);
static const uint32_t kLeaf7Edx = BIT(2) | BIT(3) | BIT(8) | BIT(23);
static const uint32_t kLeaf7Sub1Eax = BIT(4) | BIT(5);

static void on_fault(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  greg_t* r = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)r[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) {  // not a cpuid: a real fault, to the program's handler or the default
    if (chained.sa_flags & SA_SIGINFO) {
      chained.sa_sigaction(sig, info, context);
    } else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN) {
      chained.sa_handler(sig);
    } else {
      struct sigaction dfl;
      memset(&dfl, 0, sizeof dfl);
      dfl.sa_handler = SIG_DFL;
      real_sigaction()(SIGSEGV, &dfl, NULL);  // the fault repeats on return, now fatal
    }
    return;
  }
  unsigned int leaf = (unsigned int)r[REG_RAX], sub = (unsigned int)r[REG_RCX], a, b, c, d;
  set_cpuid(1);
  __cpuid_count(leaf, sub, a, b, c, d);
  set_cpuid(0);
  if (leaf == 7 && sub == 0) {
    b &= ~kLeaf7Ebx;
    c &= ~kLeaf7Ecx;
    d &= ~kLeaf7Edx;
  } else if (leaf == 7 && sub == 1) {
    a &= ~kLeaf7Sub1Eax;
  }
  r[REG_RAX] = a;
  r[REG_RBX] = b;
  r[REG_RCX] = c;
  r[REG_RDX] = d;
  r[REG_RIP] += 2;
}

int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (sig != SIGSEGV) return real_sigaction()(sig, act, old);
  if (old) *old = chained;
  if (act) chained = *act;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  return sigaction(sig, &act, &old) == 0 ? old.sa_handler : SIG_ERR;
}

__attribute__((constructor)) static void avx2_only(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  chained.sa_handler = SIG_DFL;
  if (real_sigaction()(SIGSEGV, &sa, NULL) != 0 || set_cpuid(0) != 0) {
    fprintf(stderr, "avx2_only: this CPU or kernel has no CPUID faulting (cpuid_fault in /proc/cpuinfo)\n");
    _exit(3);
  }
  setenv("EDGEDEPLOY_AVX2_ONLY", "1", 1);
}
