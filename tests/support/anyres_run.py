"""The tiny demo run (tests.support.tiny_run) as an anyres one: 16-pixel tiles of 8-pixel patches at pinpoints that
cut each 32-pixel shapes image into 2 x 2 tiles (4 overview rows + 4 lines of 4 patches and a newline = 24 rows)."""

ANYRES = ["--model.modalities.images.vit.image=16", "--model.modalities.images.vit.patch=8",
          "--model.modalities.images.anyres_grid_pinpoints=[[16, 32], [32, 16], [32, 32]]"]
ANYRES_ROWS = 24
