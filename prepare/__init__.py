"""Dataset preparation scripts: one module per dataset, each runnable as
`python prepare/<name>.py --help` and importable as `prepare.<name>`.

Every module writes data/<name>/{train,val,test}.bin (+ optional *_mask.bin)
and meta.json as one set (common.staged_dataset: staged beside the folder and
swapped in whole, so a failed or killed run leaves the old or the new complete
set); meta["format"] names the module, whose decode(ids, meta) turns token ids
back into readable text (and save_sample writes a file, e.g. MIDI);
meta["prepare"] is the command that rebuilds the set and meta["tokens"] its
token count per split. common.check_dataset checks a set before training.
"""
