package org.cellm;

/**
 * Receives a generation's text as it is made. Its methods run on the engine's thread (not
 * the caller's, and on Android not the main thread): keep them short, since every request
 * of the engine waits for them, and post to the UI thread from there. An exception thrown
 * here cancels the generation, and {@link Generation#await()} rethrows it as the cause of a
 * {@link CellmException}. {@link Generation#cancel()} may be called here; await() and the
 * close() methods may not.
 */
@FunctionalInterface
public interface TokenListener {
    /** A piece of text: one or more whole characters. */
    void onToken(String piece);

    /** Called once when the generation has finished, however it finished. */
    default void onComplete(Result result) {}
}
