"""Floor 6: held-out evaluation of the demo tasks (answers, audio-visual answers, text-to-image)."""
