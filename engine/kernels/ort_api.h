/* The part of ONNX Runtime's C API that the engine's kernels call, reached by slot index
 * (decode_attention.c says why no ONNX Runtime header is needed). */
#ifndef ENGINE_KERNELS_ORT_API_H
#define ENGINE_KERNELS_ORT_API_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define ENGINE_EXPORT __declspec(dllexport)
#define ORT_CALL __stdcall
#else
#define ENGINE_EXPORT __attribute__((visibility("default")))
#define ORT_CALL
#endif

/* Compile the hot loops for the wider vector units too, picked at load by the CPU. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HOT
#endif
#if defined(_MSC_VER)
#define ALWAYS_INLINE __forceinline
#else
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif

/* ---- the C API, as far as this file uses it ------------------------------------ */

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtOp OrtOp;
typedef struct OrtOpAttr OrtOpAttr;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef void (*OrtFn)(void);

typedef struct {
  const OrtFn* (ORT_CALL* GetApi)(uint32_t version);
  const char*(ORT_CALL* GetVersionString)(void);
} OrtApiBase;

/* The API version asked for: that of the oldest ONNX Runtime the engine supports (1.20;
   pyproject.toml), which has every entry used here. */
#define API_VERSION 20
/* The version of the OrtCustomOp table below: 16 has CreateKernelV2 and KernelComputeV2
   (which can return an error) and none of the members added after them. */
#define OP_VERSION 16

/* Indices of the entries used, in the API table. */
enum {
  SLOT_CreateStatus = 0,
  SLOT_CreateTensorWithDataAsOrtValue = 49,
  SLOT_GetTensorMutableData = 51,
  SLOT_GetTensorTypeAndShape = 65,
  SLOT_GetDimensionsCount = 61,
  SLOT_GetDimensions = 62,
  SLOT_GetTensorElementType = 60,
  SLOT_ReleaseMemoryInfo = 94,
  SLOT_ReleaseValue = 96,
  SLOT_ReleaseTensorTypeAndShapeInfo = 99,
  SLOT_CreateCpuMemoryInfo = 69,
  SLOT_KernelInfoGetAttribute_float = 85,
  SLOT_KernelInfoGetAttribute_int64 = 86,
  SLOT_KernelContext_GetInputCount = 88,
  SLOT_KernelContext_GetInput = 90,
  SLOT_KernelContext_GetOutput = 91,
  SLOT_CreateCustomOpDomain = 26,
  SLOT_CustomOpDomain_Add = 27,
  SLOT_AddCustomOpDomain = 28,
  SLOT_ReleaseStatus = 93,
  SLOT_CreateOpAttr = 211,
  SLOT_ReleaseOpAttr = 212,
  SLOT_CreateOp = 213,
  SLOT_InvokeOp = 214,
  SLOT_ReleaseOp = 215,
  SLOT_KernelContext_ParallelFor = 274,
  SLOT_KernelInfoGetConstantInput_tensor = 249,
  SLOT_KernelInfo_GetInputCount = 230,
  SLOT_KernelInfo_GetInputName = 232,
};

enum { ELEM_FLOAT = 1, ELEM_INT8 = 3, ELEM_INT16 = 5, ELEM_INT32 = 6, ELEM_FLOAT16 = 10 };
enum { OP_ATTR_INT = 1, OP_ATTR_FLOAT = 3 };
enum { INPUT_REQUIRED = 0, INPUT_OPTIONAL = 1 };
enum { ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2 };

typedef OrtStatus*(ORT_CALL* CreateStatus_t)(int code, const char* msg);
typedef void(ORT_CALL* ReleaseStatus_t)(OrtStatus*);
typedef OrtStatus*(ORT_CALL* GetTensorMutableData_t)(OrtValue*, void**);
typedef OrtStatus*(ORT_CALL* CreateTensorWithDataAsOrtValue_t)(const OrtMemoryInfo*, void*, size_t, const int64_t*,
                                                             size_t, int, OrtValue**);
typedef OrtStatus*(ORT_CALL* CreateCpuMemoryInfo_t)(int allocator_type, int mem_type, OrtMemoryInfo**);
typedef void(ORT_CALL* ReleaseMemoryInfo_t)(OrtMemoryInfo*);
typedef void(ORT_CALL* ReleaseValue_t)(OrtValue*);
typedef OrtStatus*(ORT_CALL* GetTensorTypeAndShape_t)(const OrtValue*, OrtTensorTypeAndShapeInfo**);
typedef OrtStatus*(ORT_CALL* GetDimensionsCount_t)(const OrtTensorTypeAndShapeInfo*, size_t*);
typedef OrtStatus*(ORT_CALL* GetDimensions_t)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t);
typedef OrtStatus*(ORT_CALL* GetTensorElementType_t)(const OrtTensorTypeAndShapeInfo*, int*);
typedef void(ORT_CALL* ReleaseTensorTypeAndShapeInfo_t)(OrtTensorTypeAndShapeInfo*);
typedef OrtStatus*(ORT_CALL* KernelInfoGetAttribute_float_t)(const OrtKernelInfo*, const char*, float*);
typedef OrtStatus*(ORT_CALL* KernelInfoGetAttribute_int64_t)(const OrtKernelInfo*, const char*, int64_t*);
typedef OrtStatus*(ORT_CALL* KernelContext_GetInputCount_t)(const OrtKernelContext*, size_t*);
typedef OrtStatus*(ORT_CALL* KernelContext_GetInput_t)(const OrtKernelContext*, size_t, const OrtValue**);
typedef OrtStatus*(ORT_CALL* KernelContext_GetOutput_t)(OrtKernelContext*, size_t, const int64_t*, size_t,
                                                      OrtValue**);
typedef OrtStatus*(ORT_CALL* CreateCustomOpDomain_t)(const char*, OrtCustomOpDomain**);
typedef OrtStatus*(ORT_CALL* CustomOpDomain_Add_t)(OrtCustomOpDomain*, const void*);
typedef OrtStatus*(ORT_CALL* AddCustomOpDomain_t)(OrtSessionOptions*, OrtCustomOpDomain*);
typedef OrtStatus*(ORT_CALL* CreateOpAttr_t)(const char*, const void*, int, int, OrtOpAttr**);
typedef void(ORT_CALL* ReleaseOpAttr_t)(OrtOpAttr*);
typedef OrtStatus*(ORT_CALL* CreateOp_t)(const OrtKernelInfo*, const char*, const char*, int, const char**,
                                       const int*, int, const OrtOpAttr* const*, int, int, int, OrtOp**);
typedef OrtStatus*(ORT_CALL* InvokeOp_t)(const OrtKernelContext*, const OrtOp*, const OrtValue* const*, int,
                                       OrtValue* const*, int);
typedef void(ORT_CALL* ReleaseOp_t)(OrtOp*);
typedef OrtStatus*(ORT_CALL* KernelInfoGetConstantInput_tensor_t)(const OrtKernelInfo*, size_t, int*,
                                                                 const OrtValue**);
typedef OrtStatus*(ORT_CALL* KernelInfo_GetInputCount_t)(const OrtKernelInfo*, size_t*);
typedef OrtStatus*(ORT_CALL* KernelInfo_GetInputName_t)(const OrtKernelInfo*, size_t, char*, size_t*);
typedef OrtStatus*(ORT_CALL* KernelContext_ParallelFor_t)(const OrtKernelContext*, void (*)(void*, size_t), size_t,
                                                        size_t, void*);

extern const OrtFn* g_api; /* set by RegisterCustomOps (decode_attention.c) */
#define API(name) ((name##_t)g_api[SLOT_##name])
#define TRY(call)                       \
  do {                                  \
    OrtStatus* status_ = (call);        \
    if (status_ != NULL) return status_; \
  } while (0)

static inline OrtStatus* fail(const char* message) { return API(CreateStatus)(ORT_INVALID_ARGUMENT, message); }

/* An integer attribute of the node, or `fallback` where it has none. */
static inline int64_t attr_int(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t value = fallback;
  OrtStatus* status = API(KernelInfoGetAttribute_int64)(info, name, &value);
  if (status != NULL) {
    API(ReleaseStatus)(status);
    return fallback;
  }
  return value;
}

/* A tensor's data, element type and shape (at most `max_rank` dimensions into `dims`;
   `too_many` is the error for more). */
static inline OrtStatus* tensor_info(const OrtValue* value, void** data, int* elem, int64_t* dims,
                                     size_t max_rank, size_t* rank, const char* too_many) {
  OrtTensorTypeAndShapeInfo* info = NULL;
  TRY(API(GetTensorTypeAndShape)(value, &info));
  OrtStatus* status = API(GetDimensionsCount)(info, rank);
  if (status == NULL && *rank > max_rank) status = fail(too_many);
  if (status == NULL) status = API(GetDimensions)(info, dims, *rank);
  if (status == NULL) status = API(GetTensorElementType)(info, elem);
  API(ReleaseTensorTypeAndShapeInfo)(info);
  if (status == NULL) status = API(GetTensorMutableData)((OrtValue*)value, data);
  return status;
}

/* The OrtCustomOp table, in its member order (OP_VERSION of the struct). */
typedef struct CustomOp {
  uint32_t version;
  void*(ORT_CALL* CreateKernel)(const void*, const void*, const OrtKernelInfo*);
  const char*(ORT_CALL* GetName)(const void*);
  const char*(ORT_CALL* GetExecutionProviderType)(const void*);
  int(ORT_CALL* GetInputType)(const void*, size_t);
  size_t(ORT_CALL* GetInputTypeCount)(const void*);
  int(ORT_CALL* GetOutputType)(const void*, size_t);
  size_t(ORT_CALL* GetOutputTypeCount)(const void*);
  void(ORT_CALL* KernelCompute)(void*, OrtKernelContext*);
  void(ORT_CALL* KernelDestroy)(void*);
  int(ORT_CALL* GetInputCharacteristic)(const void*, size_t);
  int(ORT_CALL* GetOutputCharacteristic)(const void*, size_t);
  int(ORT_CALL* GetInputMemoryType)(const void*, size_t);
  int(ORT_CALL* GetVariadicInputMinArity)(const void*);
  int(ORT_CALL* GetVariadicInputHomogeneity)(const void*);
  int(ORT_CALL* GetVariadicOutputMinArity)(const void*);
  int(ORT_CALL* GetVariadicOutputHomogeneity)(const void*);
  OrtStatus*(ORT_CALL* CreateKernelV2)(const void*, const void*, const OrtKernelInfo*, void**);
  OrtStatus*(ORT_CALL* KernelComputeV2)(void*, OrtKernelContext*);
} CustomOp;

/* The engine kernels' loops over tasks (decode_attention.c): ONNX Runtime's ParallelFor
   on the session's threads, or, for a short operator (`brief`: a decode step's, a few
   microseconds of work per task) where the engine has capped the threads (a busy machine:
   EngineKernelsSetThreads), on at most that many: 1 runs every task on the calling thread,
   so no step waits on a thread the OS has put aside for another program. Long operators
   (a prefill's) keep every thread: their tasks outlast a time slice. A task's result never
   depends on which thread runs it or with which others. */
OrtStatus* engine_parallel(const OrtKernelContext* context, void (*fn)(void*, size_t), size_t total, void* data,
                           int brief);

/* matmul_nbits.c: MatMulNBits, added to the engine's domain by RegisterCustomOps, and the
   vector code it runs on this CPU ("avx512-vnni" or "portable: <why>"). */
OrtStatus* engine_matmul_register(OrtCustomOpDomain* domain);
const char* engine_matmul_paths(void);

#endif
