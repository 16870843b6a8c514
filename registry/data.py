"""DataModules: the built-in ones ship with Python or a package, or are generated (nothing is downloaded); `text` and
`chat` read the user's own files or Hub dataset, `images` their own image folders, tables, shards or Hub dataset."""

from framework.data.text import ByteCorpus
from framework.registry import DATA

DATA.register(ByteCorpus, name="byte_corpus", source="pydoc", seq_len=128, batch_size=32, seed=None)

from framework.data.needle import NeedleData  # noqa: E402

DATA.register(NeedleData, name="needle", n_symbols=12, context_len=16, max_eos=32, batch_size=64, seed=None)

from framework.data.kv_recall import KVRecallData  # noqa: E402

DATA.register(
    KVRecallData, name="kv_recall", n_pairs=8, n_keys=16, n_values=16, max_eos=32, batch_size=64, seed=None,
    description="Key-value recall (the needle task's harder variant); GPU-sized, not learnable in a CPU budget.",
)

from framework.data.digits import DigitsData, SyntheticClasses  # noqa: E402

DATA.register(DigitsData, name="digits", batch_size=64, label_noise=0.0, pixel_noise=0.0, seed=None,
              description="scikit-learn's 8x8 digits as (1, 8, 8) images; optional label / pixel noise.")
DATA.register(SyntheticClasses, name="synth_classes", n_samples=10_000, label_noise=0.2, batch_size=128, seed=None,
              description="make_classification: 10 classes x 2 clusters in 64-d, 20% training label noise.")

from framework.data.digits_upsampled import UpsampledDigits  # noqa: E402

DATA.register(UpsampledDigits, name="digits_upsampled", size=16, batch_size=64, label_noise=0.2, seed=None,
              description="sklearn digits upsampled to 16x16 for a small CNN; 20% training label noise.")

from framework.data.pointer_chase import PointerChaseData  # noqa: E402

DATA.register(
    PointerChaseData, name="pointer_chase", n_pairs=8, n_symbols=16, hops=None, train_task="chain",
    distinct_answers=True, batch_size=64,
    seed=None, description="Multi-hop look-ups through a random permutation in the prompt (RLKV's reasoning toy).",
)

from framework.data.hubness import HubnessSweep  # noqa: E402

DATA.register(
    HubnessSweep, name="hubness_sweep", n=2000, dims=[2, 16, 64, 256, 1024, 2048], seeds=3, seed=None,
    description="Hubness experiments as validation data: Gaussian dimension sweep, OOD fraction, digits + noise.",
)

from framework.data.user_text import TextData  # noqa: E402

DATA.register(
    TextData, name="text", seq_len=128, batch_size=32, seed=None,
    description="Your own text: data.source= a file, folder or glob (.txt .md .jsonl .json .csv .parquet .arrow, also "
                ".gz/.bz2/.xz/.zst) or a Hub dataset id (+ data.revision=, data.config=), data.column=text (or "
                "meta.text), data.sample_by=document|line|paragraph; packed into seq_len rows, tokenized once (cached "
                "by a digest of the files' bytes).",
)

from framework.data.user_chat import ChatData  # noqa: E402

DATA.register(
    ChatData, name="chat", seq_len=512, batch_size=8, seed=None,
    description="Your own chat rows (TRL's shapes: messages, or prompt/completion; data.columns= maps other names), "
                "rendered with the model's chat template, the loss on the assistant's tokens (data.train_on="
                "assistant|last|all); whole conversations packed into seq_len rows. Needs a model with a tokenizer.",
)

from framework.data.images import ImageData  # noqa: E402

DATA.register(
    ImageData, name="images", batch_size=32, seed=None,
    description="Your own images: data.source= a folder (one folder per class; train/ validation/ split folders), "
                "a folder with metadata.csv, .parquet files, webdataset .tar shards or a Hub image dataset id; "
                "the model's transforms (timm), data.image_size= without one; bad files skipped and counted "
                "(data.strict=true refuses them).",
)
