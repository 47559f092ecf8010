"""Seams to Hugging Face transformers. Importing submodules imports transformers; `import angpt` does not."""
