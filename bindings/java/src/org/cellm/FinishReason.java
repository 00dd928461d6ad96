package org.cellm;

/** Why a generation ended (cellm_finish_reason). */
public enum FinishReason {
    /** Not finished yet. */
    NONE,
    /** A stop token (end of text, end of turn) or a stop string. */
    STOP,
    /** maxTokens, or the context is full. */
    LENGTH,
    /** {@link Generation#cancel()}, or closed before it finished. */
    CANCELLED,
    /** A failure; {@link Generation#await()} throws it. */
    ERROR;

    static FinishReason of(int code) {
        FinishReason[] v = values();
        return code >= 0 && code < v.length ? v[code] : ERROR;
    }
}
