"""Test helpers shipped with the package, e.g. a local Hugging Face Hub server (`testing.local_hub`)."""
