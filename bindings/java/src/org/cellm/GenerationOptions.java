package org.cellm;

/**
 * Limits and sampling of a generation; the defaults are the library's: greedy decoding,
 * 256 tokens at most, no penalties, no stop strings. Setters return this, to chain:
 * {@code new GenerationOptions().maxTokens(64).temperature(0.8f).seed(7)}.
 */
public final class GenerationOptions {
    int maxTokens = 256;
    float temperature = 0f;
    int topK = 0;
    float topP = 1f;
    float minP = 0f;
    float repeatPenalty = 1f;
    long seed = 0;
    String[] stop = null;

    /** Completion tokens at most; a negative number: until the context is full. */
    public GenerationOptions maxTokens(int n) {
        maxTokens = n;
        return this;
    }

    /** 0 or less: greedy (the default). */
    public GenerationOptions temperature(float t) {
        temperature = t;
        return this;
    }

    public GenerationOptions topK(int k) {
        topK = k;
        return this;
    }

    public GenerationOptions topP(float p) {
        topP = p;
        return this;
    }

    public GenerationOptions minP(float p) {
        minP = p;
        return this;
    }

    public GenerationOptions repeatPenalty(float p) {
        repeatPenalty = p;
        return this;
    }

    /** The same seed gives the same text. */
    public GenerationOptions seed(long s) {
        seed = s;
        return this;
    }

    /** Stop strings (at most 16): the text ends just before the first that appears. */
    public GenerationOptions stop(String... strings) {
        stop = strings == null ? null : strings.clone();
        return this;
    }

    int[] ints() {
        return new int[] {maxTokens, topK};
    }

    float[] floats() {
        return new float[] {temperature, topP, minP, repeatPenalty};
    }
}
