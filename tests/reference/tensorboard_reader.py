#!/usr/bin/env python3
"""Reads a TensorBoard run directory with TensorBoard's own reader, for src/train/tensorboard_test.cpp.

TensorBoard's EventAccumulator (every event kept: size guidance 0) loads the event files of LOGDIR
written by vidit's native writer; this prints, as one JSON object on stdout, what it understood:
  file_version  the version string of the event files ("brain.Event:2")
  scalars       {tag: [[step, value], ...]}                      in the order read
  histograms    {tag: [{step, min, max, num, sum, sum_squares, bucket_limit, bucket}, ...]}
  images        {tag: [{step, width, height, png_size, pixels}, ...]}  pixels: [height][width][channels]
                                                               decoded by Pillow (null without it)
  texts         {tag: [[step, text], ...]}                      the tensors of the "text" plugin
  text_plugin_tags  the tags TensorBoard files under the text plugin
  plugins       {plugin: [tag, ...]} as TensorBoard's plugins see the run (plugin_event_accumulator,
                which first migrates old-style values, e.g. simple_value, with data_compat)

Usage: tensorboard_reader.py LOGDIR
Needs tensorboard. Exit status 3 when it is missing (the test skips).
"""
import io
import json
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.util import tensor_util
except ImportError as e:  # the C++ test turns this into a skip with the reason
    print(f"missing python package: {e}", file=sys.stderr)
    sys.exit(3)

try:
    from PIL import Image
except ImportError:
    Image = None


def main(logdir):
    keep_all = {kind: 0 for kind in (ea.SCALARS, ea.HISTOGRAMS, ea.COMPRESSED_HISTOGRAMS, ea.IMAGES,
                                     ea.AUDIO, ea.TENSORS)}
    acc = ea.EventAccumulator(logdir, size_guidance=keep_all)
    acc.Reload()
    tags = acc.Tags()
    out = {"file_version": acc.file_version, "scalars": {}, "histograms": {}, "images": {}, "texts": {}}
    for tag in tags[ea.SCALARS]:
        out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
    for tag in tags[ea.HISTOGRAMS]:
        out["histograms"][tag] = [
            {"step": e.step, "min": h.min, "max": h.max, "num": h.num, "sum": h.sum,
             "sum_squares": h.sum_squares, "bucket_limit": list(h.bucket_limit), "bucket": list(h.bucket)}
            for e in acc.Histograms(tag) for h in [e.histogram_value]]
    for tag in tags[ea.IMAGES]:
        rows = []
        for e in acc.Images(tag):
            pixels = None
            if Image is not None:
                im = Image.open(io.BytesIO(e.encoded_image_string))
                im.load()
                channels = len(im.getbands())
                flat = list(im.tobytes())
                pixels = [[flat[(y * im.width + x) * channels:(y * im.width + x + 1) * channels]
                           for x in range(im.width)] for y in range(im.height)]
            rows.append({"step": e.step, "width": e.width, "height": e.height,
                         "png_size": len(e.encoded_image_string), "pixels": pixels})
        out["images"][tag] = rows
    try:
        out["text_plugin_tags"] = sorted(acc.PluginTagToContent("text").keys())
    except KeyError:  # no tag names the text plugin
        out["text_plugin_tags"] = []
    for tag in tags[ea.TENSORS]:
        rows = []
        for e in acc.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto)
            rows.append([e.step, value.item().decode("utf-8")])
        out["texts"][tag] = rows
    plugin_acc = pea.EventAccumulator(logdir, size_guidance={pea.TENSORS: 0})
    plugin_acc.Reload()
    out["plugins"] = {plugin: sorted(plugin_acc.PluginTagToContent(plugin).keys())
                      for plugin in plugin_acc.ActivePlugins()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
