"""The tuning wing: MetaSchedule databases (apply-tuning, `edgedeploy tune`, the offline tuner) and the tensor-core
GEMM configurations."""
