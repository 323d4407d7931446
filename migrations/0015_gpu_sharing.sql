-- ICEFROG GPU sharing: a job whose shared GPU ran saturated (its pair's
-- utilisation was mispredicted) never shares a GPU again.
ALTER TABLE jobs ADD COLUMN no_gpu_sharing BOOLEAN NOT NULL DEFAULT false;
