"""Dataset preparation scripts: one module per dataset, each runnable as
`python prepare/<name>.py --help` and importable as `prepare.<name>`.

Every module writes data/<name>/{train,val,test}.bin (+ optional *_mask.bin)
and meta.json; meta["format"] names the module, whose decode(ids, meta) turns
token ids back into readable text (and save_sample writes a file, e.g. MIDI).
"""
