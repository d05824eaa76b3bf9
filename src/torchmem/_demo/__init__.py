"""The bundled training script that ``torchmem demo`` runs (with a real leak, and fixed)."""
