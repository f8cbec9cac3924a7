# CachePrune build.
#   make            build/cacheprune (CPU backend)
#   make CUDA=1     also the CUDA backend (nvcc, sm_90a + compute_90 PTX)
#   make test       Criterion suites          make asan-test   the same under ASan+UBSan
#   make tsan-test  the server suite against a ThreadSanitizer build of serve
#   make mutation   named breakages (tests/mutation/*.mut) the suites must catch [MUTANTS=glob,...]
#   make bench      benchmarks                make demo        the main job on a synth model
#   make bench-detect  the detector alone (prose, adversarial inputs)
#   make bench-tier    the shared tier on Redis (fetch vs recompute, two replicas on rag-v1)
#   make bench-llama   llama.cpp (npm node-llama-cpp) beside ours, same weights
#   make bench-f32     f32 GEMMs: OpenBLAS per kernel set vs oneDNN
#   make bench-7b      synth mistral-7b in bf16: peak RSS of load + prefill + decode
#   make bench-amx     AMX tile GEMMs beside oneDNN, bf16p and VNNI int8 (ceilings in-run) [AMX_ROWS=1024]
#   make bench-export  the annotator's attention export per layer [EXPORT_TOKENS="512 1024"]
CC      ?= gcc
NVCC    ?= /usr/local/cuda/bin/nvcc
CUDA    ?= 0
# the reference kit (models, fixtures, data): tests and benchmarks read it,
# a build does not; CP_SHARED names it for the tests too
SHARED  ?= $(or $(CP_SHARED),../shared)
SAN     ?= 0
BUILD   ?= build
MARCH   ?= -march=native

WARN    := -Wall -Wextra -Werror
CFLAGS  := -std=c11 -D_POSIX_C_SOURCE=200809L $(WARN) -fopenmp -MMD -MP
# OpenBLAS built on OpenMP: our OpenMP loops and its GEMMs share one thread
# pool.  The pthread build spins up threads that fight libgomp's spinning
# workers on a 2-core machine (prefill measured at half speed).
BLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
# oneDNN (Debian libdnnl-dev, built on OpenMP too): the bf16 matmuls of the
# CPU backend where the CPU has AMX-BF16 (kernels/cpu/gemm_dnnl.c)
LDLIBS  := -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -ldnnl -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lhiredis -lcrypto -lpthread -ldl -lm -fopenmp

ifeq ($(SAN),tsan)
  # ThreadSanitizer (make tsan-test): the server's threads -- HTTP
  # connections, the engine thread, the job and metrics locks
  BUILD  := build/tsan
  CFLAGS += -O1 -g -fno-omit-frame-pointer -fsanitize=thread
  LDLIBS += -fsanitize=thread
else ifeq ($(SAN),1)
  BUILD  := build/asan
  # float-cast-overflow is not part of -fsanitize=undefined: without it a
  # double past an integer's range is cast silently (a JSON 1e30 read as
  # -2147483648 went unseen).  -O2, not -O1: at -O1 the AVX2 GEMMs' eight
  # accumulators live on the checked stack, and a kit-model prefill ran
  # 20x its plain time (6.5x at -O2; every load and store still checked)
  CFLAGS += -O2 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow
  LDLIBS += -fsanitize=address,undefined,float-cast-overflow
  # the suite's time limits, for the plain build, times 4 (tests/helpers.h
  # TEST_TIMEOUT): measured ~8x slower under ASan on a CPU without AVX-512
  CFLAGS += -DCP_TEST_TIMEOUT_SCALE=4
else
  # MARCH: the compiler's target for our loops.  The bf16 GEMM kernels pick
  # their ISA at run time (cpuid) whatever this says; MARCH=-march=x86-64-v2
  # builds a binary that runs on any x86-64 CPU the kernels support
  CFLAGS += -O2 -g $(MARCH)
endif

LIB_C   := $(wildcard kernels/*.c kernels/cpu/*.c model/*.c tokenizer/*.c pool/*.c) \
           $(wildcard engine/*.c engine/annotate/*.c engine/cache/*.c engine/detect/*.c engine/batch/*.c) \
           $(wildcard engine/server/*.c)
CLI_C   := $(wildcard engine/cli/*.c)
# the evaluation harness beside the engine (eval/): its metrics and the
# scheduling probe, which the tests link too, and the commands built on them
# (attack, workload, eval-detect), which main.c dispatches to
EVAL_LIB_C := eval/quality.c eval/probe.c
EVAL_CMD_C := $(filter-out $(EVAL_LIB_C),$(wildcard eval/*.c eval/attack/*.c))
TEST_C  := $(wildcard tests/*.c) profiling/gpu_checks.c profiling/gguf.c
CU_SRC  := $(wildcard kernels/cuda/*.cu)

ifeq ($(CUDA),1)
  CUDA_HOME ?= /usr/local/cuda
  BUILD   := $(BUILD)/cuda
  LIB_C   := $(filter-out kernels/cuda/backend_cuda_none.c,$(LIB_C))
  CFLAGS  += -DCP_CUDA=1
  NVFLAGS := -std=c++17 -MMD -MP -O2 -g -lineinfo -Xcompiler -Wall,-Wextra,-Werror -I$(CUDA_HOME)/include \
             -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
  LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
  CU_OBJ  := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
else
  LIB_C   += kernels/cuda/backend_cuda_none.c
  CU_OBJ  :=
endif

LIB_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(sort $(LIB_C))) $(CU_OBJ)
CLI_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(CLI_C))
EVAL_LIB_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(EVAL_LIB_C))
EVAL_CMD_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(EVAL_CMD_C))
TEST_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(TEST_C))
LIB      := $(BUILD)/libcacheprune.a

# CI=true (GitHub, GitLab and .ci/run set it): a missing reference kit is a
# failure there, not a skip, so CI cannot go green having run half the suite
IS_CI := $(filter-out 0 false FALSE False,$(CI))

.PHONY: FORCE all help deps test asan-test tsan-test mutation bench bench-detect bench-batch bench-serve bench-tier bench-llama bench-f32 bench-reuse bench-torch bench-7b bench-amx bench-export prof-batch bench-sharing bench-quality reuse-gap eval-privacy demo clean cuda-regs fuzz eval-detect gpu-carry gpu-packs gpu-plans gpu-check-self
all: $(BUILD)/cacheprune

# cacheprune --version: the version in engine/cli/main.c plus `git describe` when
# this is built from its own git checkout (not from a tarball unpacked inside
# some other repository).  The stamp changes only when the description does,
# so main.o is rebuilt after a commit and not on every make.
GIT_DESCRIBE := $(shell [ "$$(git rev-parse --show-toplevel 2>/dev/null)" = "$(CURDIR)" ] && \
                  git describe --always --dirty --tags 2>/dev/null | tr -cd 'A-Za-z0-9._+-')
VERSION_STAMP := $(BUILD)/version.stamp
$(VERSION_STAMP): FORCE
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = "$(GIT_DESCRIBE)" ] || echo "$(GIT_DESCRIBE)" > $@
$(BUILD)/obj/engine/cli/main.o: $(VERSION_STAMP)
$(BUILD)/obj/engine/cli/main.o: CFLAGS += -DCP_GIT_DESCRIBE='"$(GIT_DESCRIBE)"'
FORCE:

deps:
	.ci/deps

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/cacheprune: $(CLI_OBJ) $(EVAL_CMD_OBJ) $(EVAL_LIB_OBJ) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/cp_tests: $(TEST_OBJ) $(EVAL_LIB_OBJ) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

$(BUILD)/bench_forward: $(BUILD)/obj/profiling/bench_forward.o $(BUILD)/obj/profiling/bench_ceilings.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_batch: $(BUILD)/obj/profiling/bench_batch.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_serve: $(BUILD)/obj/profiling/bench_serve.o
	$(CC) $(CFLAGS) $^ -o $@ -lpthread
$(BUILD)/bench_gemm_rows: $(BUILD)/obj/profiling/bench_gemm_rows.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench_f32_gemm: $(BUILD)/obj/profiling/bench_f32_gemm.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench_f32p: $(BUILD)/obj/profiling/bench_f32p.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench_bf16p: $(BUILD)/obj/profiling/bench_bf16p.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench_amx: $(BUILD)/obj/profiling/bench_amx.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/prof_batch: $(BUILD)/obj/profiling/prof_batch.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/prof_reuse: $(BUILD)/obj/profiling/prof_reuse.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/pool_trace: $(BUILD)/obj/profiling/pool_trace.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench_attn_kv: $(BUILD)/obj/profiling/bench_attn_kv.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench_export: $(BUILD)/obj/profiling/bench_export.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_tokenizer: $(BUILD)/obj/profiling/bench_tokenizer.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_detect: $(BUILD)/obj/profiling/bench_detect.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# our GGUF writer (profiling/gguf.c): synth checkpoints for llama.cpp in make bench-llama
$(BUILD)/gguf_write: $(BUILD)/obj/profiling/gguf_main.o $(BUILD)/obj/profiling/gguf.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_pool: $(BUILD)/obj/profiling/bench_pool.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_annotate: $(BUILD)/obj/profiling/bench_annotate.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench_cuda: $(BUILD)/obj/profiling/bench_cuda.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/obj/profiling/bench_cuda.o: profiling/bench_cuda.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/gpu_pack: $(BUILD)/obj/profiling/gpu_pack.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# What profiling/gpu_check.sh carries to the lent GPU machine (which has the
# CUDA toolkit and libc, none of our Debian libraries and no ../shared): the
# fixtures and cp-books-6m as weight packs with their reference outputs.
GPU_CARRY := build/gpu_carry
gpu-carry: gpu-packs gpu-plans
gpu-packs: $(BUILD)/gpu_pack
	@[ -d "$(SHARED)/fixtures" ] || { echo "gpu-packs: reference kit not found at $(SHARED): the packs are made from its fixtures and cp-books-6m (set SHARED=DIR)" >&2; exit 1; }
	@mkdir -p $(GPU_CARRY)
	for f in qwen2-tiny mistral-tiny-swa llama-tiny; do \
	  ./$(BUILD)/gpu_pack --model $(SHARED)/fixtures/$$f --golden $(SHARED)/fixtures/$$f/golden.safetensors \
	    --name $$f --out $(GPU_CARRY)/$$f.pack || exit 1; done
	./$(BUILD)/gpu_pack --model $(SHARED)/models/cp-books-6m --name cp-books-6m --greedy 32 --out $(GPU_CARRY)/cp-books-6m.pack \
	  --text "The old lighthouse keeper climbed the stairs every evening to light the lamp, and from the top he could see the whole harbour"
# rag-v1 reuse plans made by cp-books-6m (the last 40 of 150: a warm pool) for the 7B replay
gpu-plans: $(BUILD)/gpu_pack $(BUILD)/cacheprune
	@mkdir -p $(BENCH) $(GPU_CARRY)
	./$(BUILD)/cacheprune workload --preset rag-v1 --seed 1 --out $(BENCH)/rag-v1.jsonl
	for p in none in-context canonical; do ./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) \
	  --requests $(BENCH)/rag-v1.jsonl --sharing $$( [ $$p = none ] && echo none || echo cacheprune ) \
	  $$( [ $$p = none ] || echo --segment-kv $$p ) --plan-out $(BENCH)/plan150-$$p.jsonl > /dev/null || exit 1; \
	  tail -40 $(BENCH)/plan150-$$p.jsonl > $(BENCH)/plan-last40-$$p.jsonl; \
	  ./$(BUILD)/gpu_pack --plans $(BENCH)/plan-last40-$$p.jsonl --out $(GPU_CARRY)/rag-v1-last40-$$p.plans || exit 1; done

# tiny detector plugins the tests load (tests/plugins)
TEST_PLUGINS := $(BUILD)/tests/libcp_test_plugin.so $(BUILD)/tests/cp_test_proc_plugin
$(BUILD)/tests/libcp_test_plugin.so: tests/plugins/so_plugin.c engine/detect/detect_plugin_abi.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) -O1 -g -fPIC -shared $< -o $@
$(BUILD)/tests/cp_test_proc_plugin: tests/plugins/proc_plugin.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_POSIX_C_SOURCE=200809L $(WARN) -O1 -g $< -o $@

# Tests run from the repository root; they read the kit ($(SHARED)) and
# write only under build/.  Without the kit (a fresh clone) the tests that
# need it skip and the run ends with one line saying so; under CI that is a
# failure, before anything runs.  Criterion forks one process per test and
# runs two at once: OpenMP threads that spin while waiting would then fight
# for the cores (measured: 2 min 19 s spinning vs 17 s passive on 2 cores).
# No OMP_WAIT_POLICY here: cp_tests, like every binary linking the CPU
# backend, shortens its spin itself before libgomp loads
# (kernels/cpu/cpu_runtime.h), and the commands the tests run inherit it,
# so the suite runs what a user runs.
test: $(BUILD)/cp_tests $(BUILD)/cacheprune $(BUILD)/gpu_pack $(TEST_PLUGINS)
	@if [ -n "$(IS_CI)" ] && [ ! -d "$(SHARED)/models" ]; then \
	  echo "test: reference kit not found at $(SHARED) and CI=$(CI): CI must run every test (set SHARED=DIR or CP_SHARED=DIR)" >&2; \
	  exit 1; fi
	rm -rf $(BUILD)/tmp && CP_SHARED="$(SHARED)" CP_BIN=$(BUILD)/cacheprune CP_TMP=$(BUILD)/tmp CP_PLUGINS=$(BUILD)/tests \
	  LOG=$(BUILD)/cp_tests.log tests/run_suite.sh ./$(BUILD)/cp_tests --jobs 2
	$(MAKE) --no-print-directory test-paths
	$(MAKE) node-test
	$(MAKE) gpu-check-self

# Batch invariance and the privacy canary once per compute path this CPU
# has (CP_CPU_ISA) and under OPENBLAS_CORETYPE=Prescott; a path the CPU
# lacks is skipped with a line saying so (tests/compute_paths.sh).  The
# whole suite above ran the automatic path.
.PHONY: test-paths
test-paths: $(BUILD)/cp_tests $(BUILD)/cacheprune $(TEST_PLUGINS)
	CP_SHARED="$(SHARED)" CP_BIN=$(BUILD)/cacheprune CP_TMP=$(BUILD)/tmp CP_PLUGINS=$(BUILD)/tests \
	  tests/compute_paths.sh ./$(BUILD)/cp_tests

# The official openai npm client (tests/node, pinned by its package-lock.json)
# against `serve`: npm ci only when node_modules is missing, so later runs
# need no network.  Skipped where there is no node (make deps installs it).
.PHONY: node-test
node-test: $(BUILD)/cacheprune
	@if ! command -v node > /dev/null; then echo "node-test: no node here: skipped"; exit 0; fi; \
	if [ ! -d "$(SHARED)/models/cp-books-6m" ]; then echo "node-test: reference kit not found at $(SHARED): skipped"; exit 0; fi; \
	cd tests/node && { [ -d node_modules/openai ] || npm ci --no-audit --no-fund; } && \
	  node openai_client.mjs $(abspath $(BUILD)/cacheprune) $(abspath $(SHARED))/models/cp-books-6m

# The device check's harness against itself (a CPU backend in the device's
# place), so it cannot rot while no GPU is at hand: its libc-only build with
# nvcc, the packs, every comparison.  Skipped where there is no nvcc, and
# without the kit (the packs are made from its fixtures) except under CI.
gpu-check-self: $(BUILD)/gpu_pack
	@if [ ! -d "$(SHARED)/fixtures" ]; then \
	  if [ -n "$(IS_CI)" ]; then echo "gpu-check-self: reference kit not found at $(SHARED) and CI=$(CI) (set SHARED=DIR)" >&2; exit 1; fi; \
	  echo "gpu-check-self: reference kit not found at $(SHARED) (its packs are made from the kit's fixtures; set SHARED=DIR): skipped"; \
	else $(MAKE) --no-print-directory gpu-packs || exit 1; \
	  if [ -x $(NVCC) ] || command -v nvcc > /dev/null; then OUT=$(BUILD)/gpu_check_self profiling/gpu_check.sh --cpu; \
	  else echo "gpu-check-self: no nvcc here: skipped"; fi; fi

# Mutation testing (README "Mutation testing"): each named one-line breakage
# of tests/mutation/*.mut applied in a scratch worktree, built incrementally,
# and the suites it names must fail; MUTANTS='glob,...' picks some by name.
mutation:
	MUTANTS='$(MUTANTS)' JOBS=2 tests/mutation/run.sh

# huge allocations must fail with an error we report, not abort in ASan
asan-test:
	ASAN_OPTIONS=allocator_may_return_null=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp $(MAKE) SAN=1 test

# ThreadSanitizer over the server: `serve` built with -fsanitize=thread
# (build/tsan/cacheprune) under the server suite -- its HTTP connection
# threads, the engine thread, the job, queue and metrics locks, with 32
# client threads at once in the load test.  The suite itself is the plain
# build: Criterion cannot start under TSan ("Could not initialize
# inheritable arena", Snaipe/Criterion#274), and the code under test is the
# server process anyway.  OMP_NUM_THREADS=1: libgomp is not built with
# TSan, so its barriers are invisible to it and every parallel OpenMP loop
# would be reported as a race (a false positive); with one OpenMP thread
# none runs in parallel.  Each server writes its reports under
# build/tsan/reports (exitcode 66 also fails the test that stops it); any
# report fails the target.
TSAN_FILTER ?= @(server|tier)/*
tsan-test: $(BUILD)/cp_tests $(TEST_PLUGINS)
	$(MAKE) SAN=tsan build/tsan/cacheprune
	rm -rf build/tsan/tmp build/tsan/reports && mkdir -p build/tsan/reports
	@rc=0; CP_SHARED="$(SHARED)" CP_BIN=build/tsan/cacheprune CP_TMP=build/tsan/tmp CP_PLUGINS=$(BUILD)/tests OMP_NUM_THREADS=1 \
	  CP_SLOW_MODEL=models/cp-books-6m OMP_WAIT_POLICY=passive TSAN_OPTIONS="log_path=$(CURDIR)/build/tsan/reports/tsan suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=0 exitcode=66" \
	  ./$(BUILD)/cp_tests --jobs 2 --filter '$(TSAN_FILTER)' || rc=$$?; \
	if ls build/tsan/reports/tsan.* > /dev/null 2>&1; then cat build/tsan/reports/tsan.*; \
	  echo "tsan-test: ThreadSanitizer reports above (build/tsan/reports)" >&2; exit 1; fi; \
	[ $$rc -eq 0 ] || exit $$rc; echo "tsan-test: no ThreadSanitizer report"

ifeq ($(CUDA),1)
BENCH_CUDA := $(BUILD)/bench_cuda
endif
bench: $(BUILD)/cacheprune $(BUILD)/bench_forward $(BUILD)/bench_tokenizer $(BUILD)/bench_detect $(BUILD)/bench_pool $(BUILD)/bench_annotate $(BUILD)/gguf_write \
       $(BUILD)/prof_reuse $(BENCH_CUDA)
	./$(BUILD)/bench_tokenizer
	./$(BUILD)/bench_detect
	./$(BUILD)/bench_pool
	./$(BUILD)/bench_annotate
	test -f build/synth-qwen2.5-0.5b/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b --out build/synth-qwen2.5-0.5b
	profiling/bench_dtype.sh $(BUILD) build/synth-qwen2.5-0.5b
	CP_SHARED=$(SHARED) profiling/bench_reuse.sh $(BUILD) build/synth-qwen2.5-0.5b
	$(TORCH_PY) profiling/torch_ref.py build/synth-qwen2.5-0.5b --ours $(BUILD)/bench-dtype || echo "torch_ref: failed (optional)"
	CP_BENCH_REUSE=1 CP_BENCH_DECODE=16 profiling/bench_llama.sh $(BUILD) build/synth-qwen2.5-0.5b
	$(if $(BENCH_CUDA),./$(BENCH_CUDA),@echo "bench_cuda: built with make CUDA=1 (and run by profiling/gpu_check.sh on a GPU)")

# A reuse prefill's stages (profiling/bench_reuse.sh, prof_reuse.c): the
# rag-v1 plans of the default setting replayed on synth qwen2.5-0.5b in f32 and in bf16
# through oneDNN, speedup against the compute ceiling; make bench runs it too.
bench-reuse: $(BUILD)/cacheprune $(BUILD)/prof_reuse
	test -f build/synth-qwen2.5-0.5b/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b --out build/synth-qwen2.5-0.5b
	CP_SHARED=$(SHARED) profiling/bench_reuse.sh $(BUILD) build/synth-qwen2.5-0.5b

# Eager PyTorch beside ours (profiling/torch_ref.py; optional, Debian's
# python3-torch, not in .ci/deps): prefill 1024 / decode at 1k on the same
# synth weights in f32 and bf16; one line and exit 0 without torch.
TORCH_PY ?= /usr/bin/python3
bench-torch:
	test -f build/synth-qwen2.5-0.5b/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b --out build/synth-qwen2.5-0.5b
	$(TORCH_PY) profiling/torch_ref.py build/synth-qwen2.5-0.5b --ours $(BUILD)/bench-dtype

# llama.cpp (npm node-llama-cpp, make deps) beside ours on synth qwen2.5-0.5b,
# same weights through our GGUF writer, one run; skipped with a note when the
# package is absent.  make bench runs it too, reusing bench_dtype's numbers.
bench-llama: $(BUILD)/cacheprune $(BUILD)/bench_forward $(BUILD)/gguf_write
	profiling/bench_llama.sh $(BUILD) build/synth-qwen2.5-0.5b

# The AMX tile GEMMs on the 0.5B shape's matrices at AMX_ROWS rows, 2
# threads, beside oneDNN bf16, the packed vdpbf16ps kernel and the VNNI int8
# prefill kernel, with the tile and stream ceilings measured in the same run
# (profiling/bench_amx.c); refuses, saying why, where AMX is unavailable.
AMX_ROWS ?= 1024
bench-amx: $(BUILD)/bench_amx
	./$(BUILD)/bench_amx --rows $(AMX_ROWS) --threads 2

# The annotator's attention export per layer (profiling/bench_export.c):
# the output rows every mode computes, with the export from their own
# scores (what the backend runs), beside the general kernels' export-only call and
# beside the same call with output rows (PV), oneDNN bf16 and BLAS f32,
# cp-books-6m's and qwen2.5-0.5b's heads, plain and reuse prefills.
EXPORT_TOKENS ?= 512 1024
bench-export: $(BUILD)/bench_export
	./$(BUILD)/bench_export $(EXPORT_TOKENS)

# The f32 GEMM providers (profiling/bench_f32_gemm.sh): OpenBLAS under each
# kernel set against oneDNN's f32 GEMM, at a prefill's rows and at decode's
# one, interleaved: why f32 weights run OpenBLAS with kernels from cpuid.
bench-f32: $(BUILD)/bench_f32_gemm
	profiling/bench_f32_gemm.sh $(BUILD)

# synth mistral-7b in bf16 (14.5 GB): load, 512-token prefill, 32 decode
# tokens, peak RSS (target <= 16 GB); needs ~18 GB free, deletes the model
# afterwards (CP_KEEP_7B=1 keeps it).  Not part of make bench.
bench-7b: $(BUILD)/cacheprune
	profiling/bench_7b.sh $(BUILD)

# The main job on a model that needs no download: a synth model with its own
# byte-level tokenizer (random weights: its hit rates and quality mean
# nothing), or MODEL=DIR for a real one (e.g. ../shared/models/cp-books-6m).
# Without the kit: the workload's passages are generated (rag-synth-v1,
# tokenized by the synth model itself) and the stories260K step is left out,
# with one line saying so.
MODEL ?=
demo: $(BUILD)/cacheprune
	CP_SHARED=$(SHARED) ./$(BUILD)/cacheprune demo $(if $(MODEL),--model $(MODEL))

# The privacy attack harness (THREAT_MODEL.md): attacks 1-3 on every sharing
# mode, counters shown to the attacker (the worst case) and timing; attack 4
# (decision channel) and 6 (poisoning) where segments can start mid-message,
# per --segment-kv; attack 7 (prime and probe) with and without quotas.
eval-privacy: $(BUILD)/cacheprune
	./$(BUILD)/cacheprune attack --trials 4 --candidates 16 --repeats 3 --report-reuse --attacks direct,token,misses \
	  --csv $(BUILD)/eval_privacy.csv
	for kv in in-context canonical strict; do \
	  ./$(BUILD)/cacheprune attack --trials 6 --candidates 16 --report-reuse --attacks decision,context,poison --modes chunk,cacheprune \
	    --segment-kv $$kv --csv $(BUILD)/eval_privacy_decision_$$kv.csv || exit 1; done
	./$(BUILD)/cacheprune attack --trials 16 --attacks evict --modes chunk,cacheprune --csv $(BUILD)/eval_privacy_evict.csv
	./$(BUILD)/cacheprune attack --trials 8 --candidates 8 --attacks scheduling --csv $(BUILD)/eval_privacy_scheduling.csv

# What each reuse rule of cacheprune costs beside 16-token chunks
# (profiling/reuse_gap.sh): hit rate, tokens computed and greedy agreement
# with full recompute, one rule switched off at a time, on rag-v1's first 60
# requests, chat-v1 and meetings-v1.  About half an hour on a quiet 2-core
# machine.
reuse-gap: $(BUILD)/cacheprune
	CP_SHARED=$(SHARED) profiling/reuse_gap.sh $(BUILD) $(CPB)

# Quality against full recompute under the defaults (docs/RESULTS.md,
# "Quality"): each preset with none, chunk and cacheprune (in-context) side by
# side, then canonical with none; the rag-v1 frontier around the default over
# all 150 requests (calibrate with the three quality bounds: KL, greedy agreement, ROUGE-L); per-preset
# calibrations for chat-v1 and meetings-v1 (their reuse is in its creator's
# context: R 0 may be exact there); the rag-v1 plans of the last 40 requests
# replayed on synth qwen2.5-0.5b with the selection pass timed, and the
# steady-state TTFT ratio none / cacheprune printed (target >= 2.5).
# Summaries as JSON next to the tables.  Tens of minutes on a quiet 2-core
# machine; hours on a loaded one.
QBENCH := $(BUILD)/bench-quality
QBOUNDS := --kl-budget 0.002 --greedy-min 0.95 --rouge-min 0.97
bench-quality: $(BUILD)/cacheprune
	@mkdir -p $(QBENCH)
	for w in rag-v1 chat-v1 meetings-v1; do \
	  ./$(BUILD)/cacheprune workload --preset $$w --seed 1 --out $(QBENCH)/$$w.jsonl > /dev/null || exit 1; \
	  ./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(QBENCH)/$$w.jsonl --compare none,chunk,cacheprune \
	    --summary-json $(QBENCH)/$$w.json | tee $(QBENCH)/$$w.txt || exit 1; \
	  ./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(QBENCH)/$$w.jsonl --compare none,cacheprune \
	    --segment-kv canonical --summary-json $(QBENCH)/$$w-canonical.json | tee $(QBENCH)/$$w-canonical.txt || exit 1; done
	./$(BUILD)/cacheprune calibrate --quiet-progress --model $(CPB) --requests $(QBENCH)/rag-v1.jsonl --methods epic \
	  --ratios 0.65,0.7,0.75,0.8 --segment-kvs in-context $(QBOUNDS) --out $(QBENCH)/calibration-rag-v1.json | tee $(QBENCH)/frontier-rag-v1.txt
	for w in chat-v1 meetings-v1; do ./$(BUILD)/cacheprune calibrate --quiet-progress --model $(CPB) --requests $(QBENCH)/$$w.jsonl \
	  --methods epic --ratios 0,0.75 --k0s 0,2 --segment-kvs in-context $(QBOUNDS) --out $(QBENCH)/calibration-$$w.json \
	  | tee $(QBENCH)/frontier-$$w.txt || exit 1; done
	for s in none cacheprune; do ./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(QBENCH)/rag-v1.jsonl \
	  --sharing $$s --plan-out $(QBENCH)/plan150-$$s.jsonl > /dev/null || exit 1; \
	  tail -40 $(QBENCH)/plan150-$$s.jsonl > $(QBENCH)/plan-last40-$$s.jsonl; done
	tail -40 $(QBENCH)/rag-v1.jsonl > $(QBENCH)/rag-v1-last40.jsonl
	test -f $(BUILD)/synth-qwen2.5-0.5b-cpb/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b \
	  --tokenizer $(CPB) --out $(BUILD)/synth-qwen2.5-0.5b-cpb
	for s in none cacheprune; do ./$(BUILD)/cacheprune run --quiet-progress --model $(BUILD)/synth-qwen2.5-0.5b-cpb \
	  --requests $(QBENCH)/rag-v1-last40.jsonl --plan-in $(QBENCH)/plan-last40-$$s.jsonl --max-tokens 1 \
	  --out $(QBENCH)/replay-last40-$$s.jsonl | tee $(QBENCH)/replay-last40-$$s.txt || exit 1; done
	awk -F'"ttft_ms":' 'FNR == 1 { f++ } NF > 1 { split($$2, v, ","); t[f] += v[1]; n[f]++ } \
	  END { printf "0.5B replay, last 40 rag-v1 requests: mean TTFT none %.0f ms, cacheprune %.0f ms: %.2fx lower (target 2.5x)\n", \
	  t[1] / n[1], t[2] / n[2], (t[1] / n[1]) / (t[2] / n[2]) }' $(QBENCH)/replay-last40-none.jsonl $(QBENCH)/replay-last40-cacheprune.jsonl

# The published tables (README): rag-v1 and chat-v1 on cp-books-6m, and the
# rag-v1 plans replayed at real scale on synth qwen2.5-0.5b (the last 40 of
# the 150 requests: the pool warmed up by the first 110).
BENCH := $(BUILD)/bench-sharing
CPB := $(SHARED)/models/cp-books-6m
# the detector alone: prose throughput and the adversarial inputs (linear-time detection)
bench-detect: $(BUILD)/bench_detect
	./$(BUILD)/bench_detect $(SHARED)

bench-sharing: $(BUILD)/cacheprune
	@mkdir -p $(BENCH)
	./$(BUILD)/cacheprune workload --preset rag-v1 --seed 1 --out $(BENCH)/rag-v1.jsonl
	./$(BUILD)/cacheprune workload --preset chat-v1 --seed 1 --out $(BENCH)/chat-v1.jsonl
	./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(BENCH)/rag-v1.jsonl \
	  --compare none,tenant-prefix,global-prefix,chunk,cacheprune | tee $(BENCH)/rag-v1.txt
	./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(BENCH)/chat-v1.jsonl \
	  --compare none,tenant-prefix,global-prefix,chunk,cacheprune | tee $(BENCH)/chat-v1.txt
	./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(BENCH)/chat-v1.jsonl \
	  --sharing chunk --chunk-size 128 | tee $(BENCH)/chat-v1-chunk128.txt
	./$(BUILD)/cacheprune workload --preset meetings-v1 --seed 1 --out $(BENCH)/meetings-v1.jsonl
	./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(BENCH)/meetings-v1.jsonl \
	  --compare none,tenant-prefix,global-prefix,chunk,cacheprune | tee $(BENCH)/meetings-v1.txt
	./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) --requests $(BENCH)/meetings-v1.jsonl --compare none,cacheprune \
	  --segment-kv canonical | tee $(BENCH)/meetings-v1-canonical.txt
	for kv in canonical strict; do for w in rag-v1 chat-v1; do ./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) \
	  --requests $(BENCH)/$$w.jsonl --compare none,cacheprune --segment-kv $$kv | tee $(BENCH)/$$w-$$kv.txt; done; done
	for p in none in-context canonical; do ./$(BUILD)/cacheprune run --quiet-progress --model $(CPB) \
	  --requests $(BENCH)/rag-v1.jsonl --sharing $$( [ $$p = none ] && echo none || echo cacheprune ) \
	  $$( [ $$p = none ] || echo --segment-kv $$p ) --plan-out $(BENCH)/plan150-$$p.jsonl > /dev/null || exit 1; \
	  tail -40 $(BENCH)/plan150-$$p.jsonl > $(BENCH)/plan-last40-$$p.jsonl; done
	tail -40 $(BENCH)/rag-v1.jsonl > $(BENCH)/rag-v1-last40.jsonl
	test -f $(BUILD)/synth-qwen2.5-0.5b-cpb/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b \
	  --tokenizer $(CPB) --out $(BUILD)/synth-qwen2.5-0.5b-cpb
	for p in none in-context canonical; do ./$(BUILD)/cacheprune run --quiet-progress --model $(BUILD)/synth-qwen2.5-0.5b-cpb \
	  --requests $(BENCH)/rag-v1-last40.jsonl --plan-in $(BENCH)/plan-last40-$$p.jsonl --max-tokens 1 \
	  | tee $(BENCH)/replay-last40-$$p.txt; done

# Continuous batching: the cost of a step with prefill work against a pure
# decode step (bench_batch, on cp-books-6m: what --step-tokens trades), then
# output tokens/s of run --concurrency 1 / 4 / 16 on a synth qwen2.5-0.5b
# (BATCH_MODEL=DIR for another), ratios to concurrency 1 in the same run.
BATCH_MODEL ?= $(BUILD)/synth-qwen2.5-0.5b
bench-batch: $(BUILD)/bench_batch $(BUILD)/cacheprune
	@if [ -d $(SHARED)/models/cp-books-6m ]; then ./$(BUILD)/bench_batch --dir $(SHARED)/models/cp-books-6m; \
	else echo "bench-batch: no kit at $(SHARED): the step-cost table is skipped"; fi
	test -f $(BATCH_MODEL)/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b --out $(BATCH_MODEL) --quiet-progress
	profiling/bench_batch.sh ./$(BUILD)/cacheprune $(BATCH_MODEL) $(BUILD)/bench-batch

# serve under load (profiling/bench_serve.sh, bench_serve.c): requests/s,
# output tokens/s, TTFT and inter-token p50/p95 at client concurrency 1, 4,
# 16, and 16 streams' inter-token p95 with new prompts arriving vs without,
# on a synth qwen2.5-0.5b (random weights: speed only) and cp-books-6m.
bench-serve: $(BUILD)/bench_serve $(BUILD)/cacheprune
	test -f $(BATCH_MODEL)/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b --out $(BATCH_MODEL) --quiet-progress
	profiling/bench_serve.sh ./$(BUILD)/cacheprune ./$(BUILD)/bench_serve $(BUILD)/bench-serve $(BATCH_MODEL) \
	  $(if $(wildcard $(SHARED)/models/cp-books-6m),$(SHARED)/models/cp-books-6m)
# Where a batched decode step's time goes on BATCH_MODEL (profiling/prof_batch.c):
# each op timed through a shim over the CPU backend, forward alone and through
# the batcher, B = 1 against B = 16, ratios in one run.
prof-batch: $(BUILD)/prof_batch $(BUILD)/cacheprune
	test -f $(BATCH_MODEL)/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b --out $(BATCH_MODEL) --quiet-progress
	./$(BUILD)/prof_batch --dir $(BATCH_MODEL)
# The shared tier on Redis (profiling/bench_tier.sh): fetch + place from the
# tier against recompute per 1k tokens on cp-books-6m and the 0.5B shape, and
# rag-v1 split between two replicas, sharing one Redis against isolated.
# Needs redis-server (make deps).  TIER_N: rag-v1 lines (150).
TIER_N ?= 150
bench-tier: $(BUILD)/cacheprune
	test -f $(BUILD)/synth-qwen2.5-0.5b-cpb/config.json || ./$(BUILD)/cacheprune synth --shape qwen2.5-0.5b \
	  --tokenizer $(CPB) --out $(BUILD)/synth-qwen2.5-0.5b-cpb --quiet-progress
	N=$(TIER_N) profiling/bench_tier.sh ./$(BUILD)/cacheprune $(BUILD)/bench-tier $(CPB) $(CPB) $(BUILD)/synth-qwen2.5-0.5b-cpb

# the detector on Presidio's labelled PII set, three chains: the built-ins
# alone (formats + names), the NER plugin alone and both (the default where
# make deps installed it).  Tables on stdout (mask R, the target metric, first),
# CSVs in build/.  Without the plugin its two tables are skipped, saying so.
NER_DIR ?= $(or $(CP_NER_DIR),plugins/ner)
eval-detect: $(BUILD)/cacheprune
	@echo "== built-ins alone (formats + names; --no-ner)"
	./$(BUILD)/cacheprune eval-detect --quiet-progress --no-ner --csv $(BUILD)/eval_detect_builtin.csv
	@if command -v node >/dev/null 2>&1 && [ -f $(NER_DIR)/node_modules/compromise/package.json ]; then \
	  echo "== NER plugin alone (--no-builtin --no-names --ner-dir $(NER_DIR))" && \
	  ./$(BUILD)/cacheprune eval-detect --quiet-progress --no-builtin --no-names --ner-dir $(NER_DIR) \
	    --csv $(BUILD)/eval_detect_ner.csv && \
	  echo "== both: built-ins + NER plugin (the default; --ner-dir $(NER_DIR))" && \
	  ./$(BUILD)/cacheprune eval-detect --quiet-progress --ner-dir $(NER_DIR) --csv $(BUILD)/eval_detect.csv; \
	else echo "== NER plugin alone, both: skipped (node or $(NER_DIR)/node_modules/compromise missing: make deps)"; fi

# libFuzzer targets (clang), run briefly: FUZZ_SECONDS each
FUZZ_SECONDS ?= 20
FUZZ_SRC := $(wildcard tokenizer/*.c) $(wildcard engine/detect/*.c) kernels/status.c kernels/fileio.c kernels/log.c kernels/clock.c
FUZZ_FLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow
build/fuzz/%: tests/fuzz/%.c $(FUZZ_SRC)
	@mkdir -p build/fuzz
	clang $(FUZZ_FLAGS) $^ -o $@ -lcjson -lpcre2-8 -lutf8proc -lcrypto -lpthread -ldl

PACK_SRC := model/pack.c model/model_tensors.c kernels/dtype.c kernels/status.c kernels/fileio.c kernels/log.c kernels/cpu/backend_cpu.c \
            kernels/cpu/backend_cpu_matmul.c kernels/cpu/backend_cpu_attn.c kernels/cpu/ops_cpu.c kernels/cuda/backend_cuda_none.c
build/fuzz/fuzz_pack: tests/fuzz/fuzz_pack.c $(PACK_SRC)
	@mkdir -p build/fuzz
	clang $(FUZZ_FLAGS) -DCP_NO_BLAS $^ -o $@ -lm

# the parsers of run's inputs, the config and the safetensors header: each
# its own source list (no engine, no BLAS)
ST_SRC := model/safetensors.c kernels/dtype.c kernels/status.c kernels/fileio.c kernels/log.c
build/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c $(ST_SRC)
	@mkdir -p build/fuzz
	clang $(FUZZ_FLAGS) $^ -o $@ -lcjson -lm
build/fuzz/fuzz_config: tests/fuzz/fuzz_config.c model/config.c kernels/status.c kernels/fileio.c kernels/log.c
	@mkdir -p build/fuzz
	clang $(FUZZ_FLAGS) $^ -o $@ -lcjson -lm
LINES_SRC := engine/run_lines.c engine/request_json.c engine/json_fields.c engine/tenant.c kernels/sha256.c $(wildcard tokenizer/*.c) \
             kernels/status.c kernels/fileio.c kernels/log.c
build/fuzz/fuzz_request_line build/fuzz/fuzz_plan: build/fuzz/%: tests/fuzz/%.c $(LINES_SRC)
	@mkdir -p build/fuzz
	clang $(FUZZ_FLAGS) $^ -o $@ -lcjson -lpcre2-8 -lutf8proc -lcrypto -lm
build/fuzz/fuzz_rules: tests/fuzz/fuzz_rules.c $(FUZZ_SRC)
	@mkdir -p build/fuzz
	clang $(FUZZ_FLAGS) $^ -o $@ -lcjson -lpcre2-8 -lutf8proc -lcrypto -lpthread -ldl

# make fuzz: every target from its seed corpus (tests/fuzz/corpus_*, copied
# to build/fuzz/ where the run adds what it finds), FUZZ_SECONDS each, then
# one line per target with its exec count (FUZZ_RUNS=N: N execs each instead)
FUZZ_TARGETS := tokenize tokenizer_json detect pack safetensors config rules request_line plan
FUZZ_RUNS ?=
fuzz: $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))
	@rm -f build/fuzz/execs.txt
	@mkdir -p build/fuzz/corpus_pack
	@test -f build/gpu_carry/llama-tiny.pack && cp -n build/gpu_carry/llama-tiny.pack build/fuzz/corpus_pack/ || true
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/corpus_$$t; \
	  [ -d tests/fuzz/corpus_$$t ] && cp -n tests/fuzz/corpus_$$t/* build/fuzz/corpus_$$t/ 2>/dev/null; \
	  case $$t in pack) ml=500000;; safetensors) ml=65536;; tokenizer_json) ml=8192;; *) ml=4096;; esac; \
	  lim=$$( [ -n "$(FUZZ_RUNS)" ] && echo "-runs=$(FUZZ_RUNS)" || echo "-max_total_time=$(FUZZ_SECONDS)" ); \
	  ./build/fuzz/fuzz_$$t $$lim -max_len=$$ml -print_final_stats=1 build/fuzz/corpus_$$t > build/fuzz/$$t.log 2>&1; rc=$$?; \
	  ex=$$(grep -o 'stat::number_of_executed_units: *[0-9]*' build/fuzz/$$t.log | grep -o '[0-9]*$$'); \
	  printf '%-16s %12s execs  %s\n' $$t "$${ex:-?}" "$$( [ $$rc = 0 ] && echo clean || echo "FAILED (rc $$rc, see build/fuzz/$$t.log)")" \
	    | tee -a build/fuzz/execs.txt; \
	done; ! grep -q FAILED build/fuzz/execs.txt

# register / spill report of the CUDA kernels (nvcc -Xptxas -v)
cuda-regs:
	@mkdir -p profiling
	rm -f profiling/cuda_regs.txt
	for f in $(CU_SRC); do echo "== $$f" >> profiling/cuda_regs.txt; \
	  $(NVCC) -std=c++17 -O2 -I/usr/local/cuda/include -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c $$f -o /dev/null 2>> profiling/cuda_regs.txt || exit 1; done
	grep -E "^==|Compiling entry|registers|spill" profiling/cuda_regs.txt


# make help: every target, one line each (tests/test_newcomer.c checks that
# every target of this Makefile is listed here).
help:
	@echo 'make [all]          build build/cacheprune (CPU backend; CUDA=1 adds the CUDA one)'
	@echo 'make deps           install the Debian packages and the optional npm packages (.ci/deps)'
	@echo 'make test           the Criterion suites, the openai client against serve, the device harness on the CPU'
	@echo 'make test-paths     batch invariance and the privacy canary once per compute path the CPU has (make test runs it)'
	@echo 'make asan-test      make test under ASan + UBSan'
	@echo 'make tsan-test      the server and tier suites against serve built with ThreadSanitizer'
	@echo 'make mutation       named one-line breakages (tests/mutation/*.mut) the suites must kill; MUTANTS=glob picks'
	@echo 'make fuzz           the libFuzzer targets from their seed corpora (FUZZ_SECONDS each)'
	@echo 'make demo           the main job: every sharing mode side by side on the kit model, with the privacy checks'
	@echo 'make eval-privacy   the attacks against every sharing mode (counters and timing channels)'
	@echo 'make eval-detect    detector recall / precision on the kit PII sets (formats, names, NER plugin)'
	@echo 'make bench          tokenizer, detector, pool, annotator, forward and reuse benchmarks (+ bench-llama)'
	@echo 'make bench-llama    prefill / decode against llama.cpp (node-llama-cpp) on synth qwen2.5-0.5b, same weights'
	@echo 'make bench-f32      f32 GEMM providers: OpenBLAS under each kernel set against oneDNN, prefill and decode rows'
	@echo 'make bench-reuse    a reuse prefill stage by stage on synth qwen2.5-0.5b (rag-v1 plans replayed)'
	@echo 'make bench-quality  hit rate, TTFT and quality of each sharing mode per workload preset on cp-books-6m'
	@echo 'make bench-sharing  rag-v1 plans replayed at real scale on synth qwen2.5-0.5b'
	@echo 'make reuse-gap      what each cacheprune reuse rule costs in hit rate, tokens computed and quality, beside chunks'
	@echo 'make bench-detect   the detector alone: prose throughput and adversarial inputs'
	@echo 'make bench-batch    a batched decode step and run --concurrency 1 / 4 / 16 throughput'
	@echo 'make bench-serve    serve under 1 / 4 / 16 clients: tokens/s, TTFT, inter-token latency'
	@echo 'make bench-tier     the Redis tier against recompute, and two replicas sharing one Redis'
	@echo 'make bench-torch    eager PyTorch beside ours (optional python3-torch)'
	@echo 'make bench-amx      the AMX tile GEMMs and attention beside oneDNN, bf16p and VNNI int8, with the in-run tile ceilings'
	@echo 'make bench-export   the attention export per layer: export-only call, output rows, with PV (oneDNN, BLAS)'
	@echo 'make bench-7b       a synth 7B model in bf16: load, prefill, decode, peak RSS (needs ~18 GB free)'
	@echo 'make prof-batch     where a batched decode step spends its time, op by op'
	@echo 'make node-test      the official openai npm client against serve'
	@echo 'make gpu-check-self the device check harness against the CPU backend (no GPU needed)'
	@echo 'make gpu-carry      the weight packs and plans the device check carries (gpu-packs + gpu-plans)'
	@echo 'make gpu-packs      the kit fixtures and cp-books-6m as weight packs with reference outputs'
	@echo 'make gpu-plans      rag-v1 reuse plans for the device check'"'"'s 7B replay'
	@echo 'make cuda-regs      register / spill report of the CUDA kernels (nvcc -Xptxas -v)'
	@echo 'make clean          remove build/'
	@echo 'make help           this list'

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
