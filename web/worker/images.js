// Photos and camera frames in: the browser's own decoder (createImageBitmap) and an
// OffscreenCanvas give the RGBA bytes; everything after (the resize included) is the Python
// package's, the same as native (candle_web.worker.faces).

import { TypedError } from "./common.js";

// The photo's orientation as its EXIF says (as Pillow's exif_transpose natively) and its bytes
// as stored, with no colour profile applied (Pillow applies none either), so both sides read
// the same pixels.
const BITMAP_OPTIONS = { imageOrientation: "from-image", colorSpaceConversion: "none", premultiplyAlpha: "none" };

// `image`: a Blob (a dropped photo) or an ImageBitmap (a camera frame, closed here) ->
// {width, height, rgba: Uint8ClampedArray, ms}.
export async function decodeImage(image) {
  const started = performance.now();
  let bitmap = image;
  if (image instanceof Blob) {
    try {
      bitmap = await createImageBitmap(image, BITMAP_OPTIONS);
    } catch (error) {
      throw new TypedError("FormatError", `faces: not a photo this browser can decode (${error.message})`);
    }
  }
  try {
    const { width, height } = bitmap;
    const canvas = new OffscreenCanvas(width, height);
    const context = canvas.getContext("2d", { willReadFrequently: true });
    context.drawImage(bitmap, 0, 0);
    const rgba = context.getImageData(0, 0, width, height).data;
    return { width, height, rgba, ms: performance.now() - started };
  } finally {
    bitmap.close();
  }
}

export function checkImage(message) {
  if (!(message.image instanceof Blob) && !(message.image instanceof ImageBitmap)) {
    throw new TypedError("FormatError", "faces: `image` must be a photo (a Blob or File) or an ImageBitmap");
  }
}
