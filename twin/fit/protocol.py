"""Which measured data may never be fitted: the validation sets.

A prediction is only a prediction if nothing was fitted to the runs it is
judged on. The validation files are named here, by file name and by content
(so that a renamed copy is refused too); `twin fit` refuses them, and a test
fails if any fitted machine file's provenance names one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from twin.errors import TwinError

# file name -> SHA-256 of its bytes
VALIDATION_FILES = {
    # vTrain's multi-node Megatron-DeepSpeed runs on A100s (benchmarks/data/README.md)
    "a100-megatron-multi-node.csv": "f82509a3a0fc098ad9770bd75b2abd0b5213cee7ce5b25bedd1df809cdf38fed",
    # Megatron-LM's published weak-scaling runs on Selene, 32-3072 A100s (Narayanan et al. SC'21 Table 1)
    "megatron-sc21-table1.csv": "f6027e8457a6cdd4686e4576d4a5be5dd261eae521d9620464a6b81343c14eb8",
    # Megatron-LM's runs with and without sequence parallelism and selective recompute on Selene, 8-512 A100s
    # (Korthikanti et al. MLSys'23 Table 5)
    "megatron-korthikanti-table5.csv": "955e21d7387939b6ada57b38b71445b7abfabbf00c6d3594259a5fed80160dbd",
    # MosaicML's MPT runs with FSDP and flash attention on 16-128 A100 40 GB (llm-foundry benchmarking README)
    "mpt-a100-40gb-multi-node.csv": "ef5cc3b9e7836b2f7dcab00d848391a7d967698f11b529b4a3cd1cb8da88440a",
    # the same code's runs on A100 80 GB (mostly one node), which the 40 GB one-node fit is carried to and predicts
    "mpt-a100-80gb.csv": "064c490f9937099b472f50c8389f48fabcfe749303db31b695fc9d2290ae71a7",
    # the same code's runs on 16-512 H100 80 GB (llm-foundry's H100 tables of October 2023 and January 2024)
    "mpt-h100-80gb-multi-node.csv": "930b4445bf77c72c36e14bd8a9e247b83572b1dfad3570903f03f6d0d53caa07",
    # Megatron-LM's published weak scaling on 48-6,144 H100 (its README's table of July 2024)
    "megatron-h100-2024.csv": "78c249ad2049ecbb5b14175a1481f0053a02f06be2809b9a2a966422cf3b83b1",
    # Meta's Llama 3 405B pretraining on 8,192 and 16,384 H100 (the Llama 3 paper's Table 4)
    "llama3-405b-meta-2024.csv": "9e80559b7ba2169f128d2ebfd9c7a7792877ffc1267e4f3cdb2cb334100bd9d4",
    # NVIDIA Megatron-Bridge's FP8 runs of Llama 3 70B and 3.1 405B on 64 and 1,024 H100 (its performance archive)
    "megatron-bridge-h100-fp8.csv": "8d3d0302e24d3eeac48b5a2804a0973f9bf78be0a4133c17f02e9006ddc943dd",
    # torchtitan's FSDP2 runs of Llama 2 and Llama 3 on 64 A100 80 GB (its performance page of 2024)
    "torchtitan-a100-2024.csv": "30fea0e3bf034a7763e359c243b1097f459387d3d330553368a9aaffe95f31f6",
    # torchtitan's FSDP2 runs of Llama 3.1 8B on 128 H100, eager and compiled (its performance page of 2025; its 8-GPU
    # runs, torchtitan-h100-2025-one-node.csv, are calibration data)
    "torchtitan-h100-2025-multi-node.csv": "651e8863f054d60f4b2b04043515c10d448941c772be1206210d12b25f6f2e63",
}


def check_calibration_file(path: str) -> None:
    """A one-line TwinError when `path` is, by name or by content, a validation file."""
    name = Path(path).name
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        digest = ""
    for validation, sha in VALIDATION_FILES.items():
        if name == validation or digest == sha:
            raise TwinError(f"--runs {path} is validation data ({validation}): nothing may be fitted to it; fit on "
                            "calibration runs (e.g. benchmarks/data/a100-megatron-single-node.csv) and predict it "
                            "with twin validate --runs")


# Published rows (twin validate's quantity) that a calibrated machine file was fitted on, and the file holding
# the measurement as a run: the calibrated column marks them "fit" and leaves them out of its error.
CALIBRATION_ROWS = {
    # the Frontier paper's one run on two nodes or fewer: 22B on 16 GCDs
    "Frontier paper 22B@16: TF/s per GCD": "frontier-22b-16gcd.csv",
}
