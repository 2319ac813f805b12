"""The torch.distributed backend: runs a twin Schedule for real (issue 4).

It imports twin's IR, never the other way round; torch is an optional extra
(`pip install -e '.[torch]'`). Nothing here yet.
"""
