package org.cellm;

import java.nio.charset.StandardCharsets;

/**
 * A failure reported by cellm: {@link #status()} is the library's cellm_status code (one of
 * the constants below) and the message is the library's text, such as which file could not
 * be opened and why. Unchecked, so listeners and lambdas need not declare it.
 */
public class CellmException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public static final int INVALID_ARG = 1;
    public static final int IO = 2;
    public static final int FORMAT = 3;
    public static final int UNSUPPORTED = 4;
    public static final int NO_MEMORY = 5;
    public static final int NOT_FOUND = 6;
    public static final int INTERNAL = 10;

    private final int status;

    public CellmException(int status, String message) {
        super(message);
        this.status = status;
    }

    public CellmException(int status, String message, Throwable cause) {
        super(message, cause);
        this.status = status;
    }

    /** From the JNI glue: the message as UTF-8 bytes. */
    CellmException(int status, byte[] utf8Message) {
        this(status, new String(utf8Message, StandardCharsets.UTF_8));
    }

    /** The cellm_status code (include/cellm.h). */
    public int status() {
        return status;
    }
}
