#!/usr/bin/env bash
# Fetch real speech for the audio / Whisper tests into the candle-web cache.
#
# Source: Debian's `pocketsphinx-testdata` package (real 16 kHz mono speech with transcripts):
#   librivox/*.wav + librivox/transcription, goforward.raw, something.raw (headerless int16 LE).
# Optional extras: a couple of clips synthesised with espeak-ng + sox when both are installed.
#
# Usage: scripts/fetch_test_audio.sh [DEST]
#   DEST defaults to ${CANDLE_WEB_CACHE:-$HOME/.cache/candle-web}/testdata/speech
# Idempotent: does nothing when DEST already holds the files (checked by a marker file).
set -euo pipefail

DEST="${1:-${CANDLE_WEB_CACHE:-$HOME/.cache/candle-web}/testdata/speech}"
PACKAGE="pocketsphinx-testdata"
DATA_DIR_IN_PACKAGE="usr/share/pocketsphinx/test/data"
MARKER="$DEST/.complete"

log() { echo "fetch_test_audio: $*" >&2; }

if [[ -f "$MARKER" ]]; then
    log "already present in $DEST"
    exit 0
fi

for tool in apt-get dpkg; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        log "'$tool' not found: this script needs a Debian-family system (package $PACKAGE)"
        exit 1
    fi
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

download_package() {
    (cd "$WORK" && apt-get download "$PACKAGE" >/dev/null 2>&1)
}

# Only refresh the package lists when the download fails without them (keeps re-runs offline).
if ! download_package; then
    log "apt-get download failed; running apt-get update once and retrying"
    apt-get update -qq >/dev/null
    if ! download_package; then
        log "could not download Debian package $PACKAGE"
        exit 1
    fi
fi

DEB="$(ls "$WORK"/"$PACKAGE"_*.deb | head -n 1)"
dpkg -x "$DEB" "$WORK/extracted"
SRC="$WORK/extracted/$DATA_DIR_IN_PACKAGE"

mkdir -p "$DEST/librivox"
cp "$SRC"/librivox/*.wav "$SRC/librivox/transcription" "$DEST/librivox/"
cp "$SRC/goforward.raw" "$SRC/something.raw" "$DEST/"
log "copied $(ls "$DEST"/librivox/*.wav | wc -l) LibriVox clips and 2 raw clips from $(basename "$DEB")"

# Optional synthetic clips: exercise other sample rates than 16 kHz through a real resample.
if command -v espeak-ng >/dev/null 2>&1 && command -v sox >/dev/null 2>&1; then
    mkdir -p "$DEST/synth"
    espeak-ng -w "$WORK/hello.wav" "Hello world, this is a test of the speech recogniser."
    sox "$WORK/hello.wav" -r 16000 -c 1 -b 16 "$DEST/synth/hello_16k.wav"
    sox "$WORK/hello.wav" -r 44100 -c 2 -b 16 "$DEST/synth/hello_44k1_stereo.wav"
    log "synthesised extra clips with espeak-ng + sox"
else
    log "espeak-ng/sox not installed: skipping the optional synthetic clips"
fi

touch "$MARKER"
log "done: $DEST"
