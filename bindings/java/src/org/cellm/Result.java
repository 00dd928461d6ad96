package org.cellm;

/** How a generation ended, with its whole text. */
public final class Result {
    private final String text;
    private final FinishReason finishReason;
    private final int promptTokens, completionTokens, cachedTokens;

    Result(String text, FinishReason finishReason, int promptTokens, int completionTokens,
            int cachedTokens) {
        this.text = text;
        this.finishReason = finishReason;
        this.promptTokens = promptTokens;
        this.completionTokens = completionTokens;
        this.cachedTokens = cachedTokens;
    }

    /** All the pieces, in order. */
    public String text() {
        return text;
    }

    public FinishReason finishReason() {
        return finishReason;
    }

    public int promptTokens() {
        return promptTokens;
    }

    public int completionTokens() {
        return completionTokens;
    }

    /** Prompt tokens a chat session kept from earlier turns (not computed again). */
    public int cachedTokens() {
        return cachedTokens;
    }

    @Override
    public String toString() {
        return "Result{" + finishReason + ", prompt " + promptTokens + ", completion "
                + completionTokens + " tokens}";
    }
}
