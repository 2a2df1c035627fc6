"""Bad command lines for `furnace emulate` (Ape, ICS '22): each must exit 2 with one line.

Read by the central CLI-contract test: every case fails before any work starts (the data
check of `emulate gemm --dist` looks at the generated operands before multiplying them;
`emulate app gemm-wide` refuses at its first product), names the argument, says what is
allowed.
"""

BAD_INPUTS: list[tuple[str, list[str]]] = [
    # emulate gemm
    ("emulate-gemm-unknown-type", ["emulate", "gemm", "--type", "NOPE"]),
    ("emulate-gemm-oz2-ascend", ["emulate", "gemm", "--type", "OZ2", "--profile", "ascend910"]),
    ("emulate-gemm-oz1-zero-slices", ["emulate", "gemm", "--type", "OZ1-S0"]),
    ("emulate-gemm-oz2-too-many-moduli", ["emulate", "gemm", "--type", "OZ2-N21"]),
    ("emulate-gemm-fp32b-ascend", ["emulate", "gemm", "--type", "FP32-B", "--profile",
                                   "ascend910"]),
    ("emulate-gemm-bf16-ascend", ["emulate", "gemm", "--type", "BF16", "--profile", "ascend910"]),
    ("emulate-gemm-fp32t-toy", ["emulate", "gemm", "--type", "FP32-T", "--profile", "toy"]),
    ("emulate-gemm-size-zero", ["emulate", "gemm", "--type", "FP16", "--size", "0"]),
    ("emulate-gemm-size-negative", ["emulate", "gemm", "--type", "FP16", "--size", "-3"]),
    ("emulate-gemm-size-text", ["emulate", "gemm", "--type", "FP16", "--size", "big"]),
    ("emulate-gemm-size-huge", ["emulate", "gemm", "--type", "FP16", "--size", "100000"]),
    ("emulate-gemm-seed-negative", ["emulate", "gemm", "--type", "FP16", "--seed", "-1"]),
    ("emulate-gemm-seed-text", ["emulate", "gemm", "--type", "FP16", "--seed", "x"]),
    ("emulate-gemm-dist-unknown", ["emulate", "gemm", "--type", "FP16", "--dist", "cauchy"]),
    ("emulate-gemm-profile-unknown", ["emulate", "gemm", "--type", "FP16", "--profile", "v100"]),
    ("emulate-gemm-fp32f-wide-data", ["emulate", "gemm", "--type", "FP32-F", "--dist", "wide",
                                      "--size", "64"]),
    ("emulate-gemm-fp16-wide-data", ["emulate", "gemm", "--type", "FP16", "--dist", "wide",
                                     "--size", "32"]),
    # emulate app
    ("emulate-app-unknown", ["emulate", "app", "nope", "--type", "FP16"]),
    ("emulate-app-unknown-type", ["emulate", "app", "cg", "--type", "FP64"]),
    ("emulate-app-int16", ["emulate", "app", "kmeans", "--type", "INT16"]),
    ("emulate-app-fp32b-ascend", ["emulate", "app", "kmeans", "--type", "FP32-B", "--profile",
                                  "ascend910"]),
    ("emulate-app-size-unknown", ["emulate", "app", "cg", "--type", "FP16", "--size", "huge"]),
    ("emulate-app-profile-unknown", ["emulate", "app", "cg", "--type", "FP16", "--profile",
                                     "tpu"]),
    ("emulate-app-fp32f-wide-data", ["emulate", "app", "gemm-wide", "--type", "FP32-F",
                                     "--size", "tiny"]),
    # emulate select
    ("emulate-select-unknown", ["emulate", "select", "nope"]),
    ("emulate-select-requirement-zero", ["emulate", "select", "cg", "--requirement", "0"]),
    ("emulate-select-requirement-negative", ["emulate", "select", "cg", "--requirement",
                                             "-1e-3"]),
    ("emulate-select-requirement-nan", ["emulate", "select", "cg", "--requirement", "nan"]),
    ("emulate-select-requirement-inf", ["emulate", "select", "cg", "--requirement", "inf"]),
    ("emulate-select-requirement-text", ["emulate", "select", "cg", "--requirement", "tight"]),
    ("emulate-select-size-unknown", ["emulate", "select", "cg", "--size", "large"]),
    ("emulate-select-profile-unknown", ["emulate", "select", "cg", "--profile", "mi300"]),
    # emulate types
    ("emulate-types-k-zero", ["emulate", "types", "--k", "0"]),
    ("emulate-types-k-text", ["emulate", "types", "--k", "many"]),
    ("emulate-types-k-huge", ["emulate", "types", "--k", "10000000"]),
    ("emulate-types-profile-unknown", ["emulate", "types", "--profile", "gpu"]),
    ("emulate-types-extra-flag", ["emulate", "types", "--verbose"]),
]
